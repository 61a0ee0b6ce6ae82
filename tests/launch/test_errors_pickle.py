"""A run's errors pickle and unpickle with every field and their message, so a run inside a
process pool or a batch tool can hand its error back (issue 42, item 10).

The real case last: a ProcessPoolExecutor child runs ddp_lab.run, the run fails, and the
error the child raises reaches the parent through the pool's own pickling.
"""

from __future__ import annotations

import os
import pickle
import subprocess
import sys

import pytest

from ddp_lab.launch.errors import (DistributedRunError, ForkServerUnresponsive,
                                   UnreadableResult, WorkerError, WorkerTimeout)

pytestmark = pytest.mark.timeout(180)


def _fields(err: BaseException) -> dict:
    return {name: value for name, value in vars(err).items()}


def _round_trip(err):
    back = pickle.loads(pickle.dumps(err))
    assert type(back) is type(err)
    assert str(back) == str(err) and back.args == err.args
    assert _fields(back) == _fields(err)
    return back


def test_worker_error_round_trips_with_its_fields():
    err = WorkerError(2, 1, "Traceback ...\nValueError: x", ["a", "b", "c"],
                      knock_on={0: "RuntimeError: Connection closed by peer"}, hint="a hint",
                      also_failed={1: "ValueError: y"}, values=[None, 1, None])
    back = _round_trip(err)
    assert (back.rank, back.exitcode, back.knock_on, back.also_failed, back.values,
            back.hint, back.logs) == (2, 1, err.knock_on, err.also_failed, [None, 1, None],
                                      "a hint", ["a", "b", "c"])


def test_worker_timeout_and_unreadable_result_round_trip():
    timeout = _round_trip(WorkerTimeout(5, [0, 2], {0: "Stack:\n  File ...", 2: "x"},
                                        ["", "", ""]))
    assert (timeout.timeout, timeout.stuck_ranks, timeout.stacks) == (5, [0, 2],
                                                                       {0: "Stack:\n  File ...",
                                                                        2: "x"})
    unreadable = _round_trip(UnreadableResult({2: "E: two", 1: "E: one"}, [0, None, None],
                                              ["", "", ""]))
    assert (unreadable.rank, unreadable.reasons, unreadable.values) == (
        1, {1: "E: one", 2: "E: two"}, [0, None, None])


def test_a_live_call_s_note_and_session_state_survive():
    """A live call appends what became of the ranks to the message and sets err.session:
    the copy must say the same, not a message rebuilt from the fields."""
    err = WorkerError(0, 1, "tb", ["", ""])
    err.session = "kept"
    err.args = (f"{err}\n\nEvery rank answered: the ranks keep their namespaces.",)
    back = _round_trip(err)
    assert back.session == "kept" and str(back).endswith("keep their namespaces.")


def test_plain_run_errors_round_trip():
    for err in (DistributedRunError("the fork server died"),
                ForkServerUnresponsive("stopped answering")):
        _round_trip(err)


JOBS = """
import time

import torch.distributed as dist

import ddp_lab
from ddp_lab.launch.errors import UnreadableResult


def fail_on_rank_1():
    if dist.get_rank() == 1:
        raise ValueError("bad batch 7")
    return dist.get_rank()


def hang_on_rank_0():
    if dist.get_rank() == 0:
        time.sleep(60)
    return dist.get_rank()


def job(which):
    if which == "error":
        ddp_lab.run(fail_on_rank_1, world_size=2, echo=False)
    elif which == "timeout":
        ddp_lab.run(hang_on_rank_0, world_size=2, timeout=3, echo=False)
    raise UnreadableResult({1: "ModuleNotFoundError: No module named 'x'"}, [0, None],
                           ["log 0", "log 1"])
"""
BATCH = """
import multiprocessing
import pickle
import sys
from concurrent.futures import ProcessPoolExecutor

import jobs

if __name__ == "__main__":
    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
        futures = {which: pool.submit(jobs.job, which)
                   for which in ("error", "timeout", "unreadable")}
        caught = {which: future.exception(timeout=150) for which, future in futures.items()}
    with open(sys.argv[1], "wb") as f:
        pickle.dump(caught, f)
"""


def test_errors_come_back_from_a_process_pool_child(tmp_path):
    """A batch script (a process of its own, so that multiprocessing's resource tracker goes
    with it) runs three failing jobs in a spawned ProcessPoolExecutor child, whose errors
    reach it through the pool's pickling; it pickles them once more for this test."""
    (tmp_path / "jobs.py").write_text(JOBS)
    (tmp_path / "batch.py").write_text(BATCH)
    out = tmp_path / "caught.pkl"
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}  # the ranks import jobs too
    done = subprocess.run([sys.executable, str(tmp_path / "batch.py"), str(out)], env=env,
                          capture_output=True, text=True, timeout=170)
    assert done.returncode == 0, done.stderr[-3000:]
    caught = pickle.loads(out.read_bytes())
    error, timeout, unreadable = caught["error"], caught["timeout"], caught["unreadable"]
    assert type(error) is WorkerError and error.rank == 1
    assert "ValueError: bad batch 7" in error.traceback
    assert len(error.logs) == 2 and str(error).startswith("rank 1 failed")
    assert type(timeout) is WorkerTimeout and timeout.stuck_ranks == [0]
    assert "time.sleep(60)" in timeout.stacks[0] and str(timeout).startswith("timed out after 3 s")
    assert type(unreadable) is UnreadableResult and unreadable.values == [0, None]
