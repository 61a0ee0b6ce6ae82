"""05b review: is the resumed run bit-identical to the uninterrupted one on 3 ranks too?
(resume.stop_and_resume and midepoch.stop_and_resume, as in cells 31 and 36, world_size 2 and 3)."""
import tempfile
import torch
from ddp_lab.course.ch05_ddp_basics import resume, midepoch

for world in (2, 3):
    with tempfile.TemporaryDirectory() as folder:
        runs = resume.stop_and_resume(folder, stop_after=4, world_size=world)
    full = runs["uninterrupted"]
    diffs = [float((w - full["weights"][s]).abs().max())
             for s, w in zip(runs["resumed"]["steps"], runs["resumed"]["weights"])]
    print(f"resume.py, {world} ranks: bit-identical per step "
          f"{[d == 0 for d in diffs]}, max |diff| {max(diffs):.1e}")
    with tempfile.TemporaryDirectory() as folder:
        ep = midepoch.stop_and_resume(folder, stop_after=6, world_size=world)
    r, u = ep["resumed"][0], ep["uninterrupted"][0]
    same = [torch.equal(w, u["weights"][s]) for s, w in zip(r["steps"], r["weights"])]
    print(f"midepoch.py, {world} ranks: steps {r['steps']}, bit-identical per step {same}")
