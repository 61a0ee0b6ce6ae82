"""A rank that dies after its code returned (in teardown, at the interpreter's exit) is told
as such: what it had finished, what arrived, the known cause and the fix."""

from __future__ import annotations

import os
import textwrap

import pytest
import torch.distributed as dist

import ddp_lab
from ddp_lab.launch.verdict import died_after_return as exit_abort

pytestmark = pytest.mark.timeout(240)

# torch 2.13's race (gloo's thread asks for the GIL while Python finalizes) cannot be
# scheduled on demand: this script ends the same way, with std::terminate called from the
# interpreter's exit and no Python frame on any thread, on rank 1 only.
FINISHES_THEN_ABORTS = textwrap.dedent("""
    import atexit, ctypes
    import torch
    import torch.distributed as dist
    import ddp_lab

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    total = torch.tensor([rank + 1.0])
    dist.all_reduce(total)
    ddp_lab.report({"rank": rank, "sum": total.item()})
    dist.destroy_process_group()
    if rank == 1:
        atexit.register(ctypes.CDLL("libstdc++.so.6")._ZSt9terminatev)
    print(f"rank {rank} done", flush=True)
""")


@pytest.fixture()
def script(tmp_path):
    path = tmp_path / "finishes_then_aborts.py"
    path.write_text(FINISHES_THEN_ABORTS)
    return str(path)


def test_an_abort_at_exit_under_torchrun_is_told_as_teardown(script):
    with pytest.raises(ddp_lab.WorkerError) as caught:
        ddp_lab.run_script(script, world_size=2, launcher="torchrun", echo=False,
                           timeout=120)
    err = caught.value
    message = str(err)
    assert err.rank == 1 and err.finished, message
    assert "finished its work, then its process died on the way out (killed by SIGABRT)" \
        in message
    assert "Its last output line: 'rank 1 done'." in message
    assert err.values == [{"rank": 0, "sum": 3.0}, {"rank": 1, "sum": 3.0}]
    assert "import torch.distributed.nn" in message and "os._exit(0)" in message
    assert "it is the root cause" not in message


def test_the_same_script_under_ddp_labs_launcher_never_runs_the_exit(script):
    """Its ranks end with os._exit after the group is destroyed: no atexit, no finalizing."""
    res = ddp_lab.run_script(script, world_size=2, echo=False, timeout=120)
    assert res.values == [{"rank": 0, "sum": 3.0}, {"rank": 1, "sum": 3.0}]


def returns_then_dies_in_teardown():
    """fn returns; rank 1 then aborts where the launcher destroys the group."""
    if dist.get_rank() == 1:
        dist.destroy_process_group = os.abort
    return dist.get_rank()


def test_a_death_after_fn_returned_keeps_the_values():
    with pytest.raises(ddp_lab.WorkerError) as caught:
        ddp_lab.run(returns_then_dies_in_teardown, world_size=2, echo=False)
    err = caught.value
    assert err.finished and err.rank == 1 and err.values == [0, 1]
    assert "after its code had returned" in str(err)
    assert exit_abort.AFTER_RETURN_ADVICE in str(err)  # not gloo's known abort


@pytest.mark.parametrize("log, last", [
    ("a\nrank 1 done\nterminate called without an active exception\nFatal Python error: "
     "Aborted\n\nThread 0x1 (most recent call first):\n  <no Python frame>\n", "rank 1 done"),
    ("Fatal Python error: Aborted\n\nCurrent thread 0x2 (most recent call first):\n"
     "  File \"/x.py\", line 3 in <module>\nstdout came last\n", "stdout came last"),
    ("only\n\n", "only"),
    ("", ""),
])
def test_last_line_stops_at_the_crash_report(log, last):
    assert exit_abort.last_line(log) == last


# What PyTorch's DDP tutorial's elastic_ddp.py (gloo, with ``import torch.distributed.nn``
# added at its top) printed when it hung under torchrun on 2 busy cores (4 of 8 runs; SIGABRT
# sent after 75 s for this report): the main thread still on the line calling demo_basic(),
# freeing its locals, the DDP model destroys the group it holds last, with the GIL; gloo's
# thread (no Python frame) waits for the GIL to drop its last work. With ``del ddp_model``
# before destroy_process_group(): 8 of 8 runs finished.
ELASTIC_DDP_HANG = """\
Finished running basic DDP example on rank 0.
Fatal Python error: Aborted

Thread 0x00007f5cdce126c0 (most recent call first):
  <no Python frame>

Current thread 0x00007f5cfd847b80 (most recent call first):
  File "/tmp/ex/elastic_ddp.py", line 45 in <module>

Extension modules: numpy._core._multiarray_umath, torch._C (total: 2)
"""
EXIT_ABORT = """\
rank 1 done
terminate called without an active exception
Fatal Python error: Aborted

Current thread 0x00007f5cfd847b80 (most recent call first):
  <no Python frame>
"""


def test_the_elastic_tutorials_hang_is_a_teardown_hang_not_an_exit_abort():
    from ddp_lab.launch.verdict.stacks import (TEARDOWN_ADVICE, format_dump, hang_advice,
                                               no_python_running)
    assert not no_python_running(ELASTIC_DDP_HANG)  # its script had not ended
    assert no_python_running(EXIT_ABORT)
    stack = format_dump(ELASTIC_DDP_HANG)
    assert hang_advice([stack]) == TEARDOWN_ADVICE
    assert "del ddp_model" in TEARDOWN_ADVICE and "torch.distributed.nn" in TEARDOWN_ADVICE
