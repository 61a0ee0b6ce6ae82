"""A rank that dies after its code returned (in teardown, at the interpreter's exit) is told
as such: what it had finished, what arrived, the known cause and the fix."""

from __future__ import annotations

import os
import textwrap

import pytest
import torch.distributed as dist

import ddp_lab
from ddp_lab.launch import exit_abort

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
    assert exit_abort.TEARDOWN_ADVICE in str(err)  # not gloo's known abort


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
