"""The DDP tutorial's cleanup() (destroy_process_group() with the DDP model still alive)
must never hang a rank; and when a rank does hang tearing a group down, the timeout says so.

Why it hung, and the fix: ddp_lab/launch/rank/teardown.py. The repeats below are sized so that,
before the fix, a hang was all but certain (it struck about 1 step in 20 to 1 in 3); a hang
shows as a WorkerTimeout, so no test here can itself hang past its pytest timeout.
"""

from __future__ import annotations

import time

import pytest
import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

import ddp_lab
from ddp_lab.course.models import ToyModel
from ddp_lab.launch.errors import WorkerTimeout
from ddp_lab.launch.verdict.stacks import DESTRUCTOR, TEARDOWN_ADVICE, format_dump, waiting_in

pytestmark = pytest.mark.timeout(240)

STEPS_PER_RUN = 60
RUNS = 5
PAUSE_S = 1.0  # warm runs apart, as in a notebook: the timing that made the hang frequent


def one_step(model) -> None:
    optimizer = torch.optim.SGD(model.parameters(), lr=0.001)
    optimizer.zero_grad()
    nn.MSELoss()(model(torch.randn(20, 10)), torch.randn(20, 5)).backward()
    optimizer.step()


def tutorial_step_then_cleanup() -> bool:
    """demo_basic's body under ddp_lab.run (the group is ready): one step, then cleanup()
    with ddp_model alive; the model dies when this returns."""
    ddp_model = DDP(ToyModel())
    one_step(ddp_model)
    dist.destroy_process_group()
    return True


def destroy_with_live_model_repeatedly(times: int) -> int:
    """The same pattern many times in one run, on a fresh group each time."""
    for _ in range(times):
        ddp_model = DDP(ToyModel(), process_group=dist.new_group())
        one_step(ddp_model)
        dist.destroy_process_group(ddp_model.process_group)
        del ddp_model  # before the fix: the group's destructor ran here, holding the GIL
    return times


def test_destroying_the_group_under_a_live_ddp_model_many_times_does_not_hang():
    res = ddp_lab.run(destroy_with_live_model_repeatedly, world_size=2,
                      args=(STEPS_PER_RUN,), timeout=45, echo=False)
    assert res.values == [STEPS_PER_RUN, STEPS_PER_RUN]


def test_the_tutorials_cleanup_after_a_pause_does_not_hang():
    """Warm runs with a pause between them, ranks forked with torch._dynamo loaded (the
    timing that made the hang frequent: 6 of 20 runs)."""
    for _ in range(RUNS):
        time.sleep(PAUSE_S)
        res = ddp_lab.run(tutorial_step_then_cleanup, world_size=2, timeout=60, echo=False)
        assert res.values == [True, True]


def test_a_script_that_destroys_the_group_under_its_model_does_not_hang(tmp_path):
    """pytorch/examples multigpu_torchrun.py's shape: the group is the script's own, and
    destroy_process_group comes from `from torch.distributed import ...`."""
    script = tmp_path / "train.py"
    script.write_text(
        "import torch, torch.nn as nn\n"
        "from torch.distributed import destroy_process_group, init_process_group, new_group\n"
        "from torch.nn.parallel import DistributedDataParallel as DDP\n"
        "from ddp_lab.course.models import ToyModel\n"
        "init_process_group('gloo')\n"
        "for _ in range(40):\n"
        "    model = DDP(ToyModel(), process_group=new_group())\n"
        "    nn.MSELoss()(model(torch.randn(20, 10)), torch.randn(20, 5)).backward()\n"
        "    destroy_process_group(model.process_group)\n"
        "    del model\n"
        "destroy_process_group()\n")
    res = ddp_lab.run_script(str(script), world_size=2, timeout=45, echo=False)
    assert len(res.logs) == 2


# A faulthandler dump taken from a rank stuck in this deadlock (torch 2.13, gloo): gloo's
# worker thread has a Python thread state but no frame (it waits for the GIL); the main thread
# sits on the line whose return freed the model.
DEADLOCK_DUMP = """\
Thread 0x00007faad06126c0 (most recent call first):
  <no Python frame>

Current thread 0x00007faaf3c6bb80 (most recent call first):
  File "/home/me/train.py", line 10 in main
  File "/home/me/train.py", line 12 in <module>
"""

DESTROY_DUMP = """\
Current thread 0x00007faaf3c6bb80 (most recent call first):
  File "/x/site-packages/torch/distributed/distributed_c10d.py", line 2395 in destroy_process_group
  File "/x/site-packages/torch/distributed/c10d_logger.py", line 81 in wrapper
  File "/home/me/train.py", line 30 in cleanup
  File "/home/me/train.py", line 12 in <module>
"""

ALL_REDUCE_DUMP = """\
Current thread 0x00007faaf3c6bb80 (most recent call first):
  File "/x/site-packages/torch/distributed/distributed_c10d.py", line 2900 in all_reduce
  File "/home/me/train.py", line 12 in <module>
"""


def test_a_thread_without_python_frames_is_shown_and_named_as_a_destructor_wait():
    stack = format_dump(DEADLOCK_DUMP)
    assert "no Python frame" in stack and 'train.py", line 10, in main' in stack
    assert waiting_in(stack) == DESTRUCTOR
    assert waiting_in(format_dump(DESTROY_DUMP)) == "destroy_process_group"


@pytest.mark.parametrize("dump", [DEADLOCK_DUMP, DESTROY_DUMP])
def test_a_timeout_in_teardown_says_so_instead_of_blaming_a_collective(dump):
    stack = format_dump(dump)
    err = WorkerTimeout(5, [0, 1], {0: stack, 1: stack}, ["", ""])
    assert TEARDOWN_ADVICE in str(err)
    assert "A collective that some rank never joins" not in str(err)
    assert "del ddp_model" in str(err)
    assert "rank 0 was here, waiting in " + waiting_in(stack) in str(err)


def test_a_timeout_with_any_rank_in_a_collective_keeps_the_collective_advice():
    teardown, collective = format_dump(DEADLOCK_DUMP), format_dump(ALL_REDUCE_DUMP)
    err = WorkerTimeout(5, [0, 1], {0: teardown, 1: collective}, ["", ""])
    assert "A collective that some rank never joins" in str(err)
    assert TEARDOWN_ADVICE not in str(err)
