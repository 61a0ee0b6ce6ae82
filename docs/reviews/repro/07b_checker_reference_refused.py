"""07b cell 10/11: is the reference refused by ex.check, and with which words, however it is
reached (scratch.DDP, ex.solution, a re-import, a subclass with nothing of its own)?"""
import importlib
import time

import ddp_lab.exercises as ex
from ddp_lab import scratch

reimported = importlib.reload(importlib.import_module("ddp_lab.scratch.ddp")).DDP


class Sub(scratch.DDP):
    pass


for label, cls in (("scratch.DDP", scratch.DDP), ("ex.solution", ex.solution("07b.your_own_ddp")),
                   ("reloaded module", reimported), ("empty subclass", Sub)):
    start = time.time()
    try:
        ex.check("07b.your_own_ddp", cls)
        said = "passed"
    except ex.ExerciseFailed as failure:
        said = str(failure)
    print(f"{label} ({time.time() - start:.1f} s): {said.splitlines()[0][:300]}")

# c11's side effect: a learner's own failed check, then the summary's refused check of the
# reference: which failure does ex.last_failure() hold?
def wrong_throughput(samples, seconds):
    return 1.0


try:
    ex.check("06.global_throughput", wrong_throughput)
except ex.ExerciseFailed:
    pass
print("after the learner's failed check, last_failure:", ex.last_failure().name)
try:
    ex.check("07b.your_own_ddp", scratch.DDP)
except ex.ExerciseFailed:
    pass
print("after c11's refused check, last_failure:", ex.last_failure().name)
