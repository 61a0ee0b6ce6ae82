"""A new fork server imports torch before it forks anything: seconds on a quiet machine, many
more on busy cores. That time is not the run's timeout's: a run starts its clock once the
server is ready, and a server that never gets ready is killed, not waited for forever. It is
the call's time, which ``res.seconds`` tells."""

from __future__ import annotations

import os
import signal
import threading
import time

import pytest
import torch.distributed as dist

import ddp_lab
from conftest import wait_until_gone
from ddp_lab.launch.forkserver import client as spawner

SLOW_START_S = 6.0


@pytest.fixture
def slow_new_server(tmp_path, monkeypatch):
    """The next fork server starts SLOW_START_S later than usual (a sitecustomize that sleeps,
    as busy cores would make the import of torch take), and is shut down afterwards."""
    (tmp_path / "sitecustomize.py").write_text(f"import time\ntime.sleep({SLOW_START_S})\n")
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    ddp_lab.shutdown()
    yield
    ddp_lab.shutdown()


def test_a_slow_start_is_not_on_the_clock_of_the_first_run(slow_new_server):
    res = ddp_lab.run(dist.get_rank, 2, timeout=1, echo=False)
    assert res.values == [0, 1]


def test_a_new_server_stopped_while_it_imports_is_killed(slow_new_server):
    stopped = []

    def stop_it():
        deadline = time.monotonic() + 30
        while spawner.fork_server_pid() is None and time.monotonic() < deadline:
            time.sleep(0.01)
        stopped.append(spawner.fork_server_pid())
        os.kill(stopped[0], signal.SIGSTOP)

    threading.Thread(target=stop_it, daemon=True).start()
    with pytest.raises(ddp_lab.ForkServerUnresponsive, match="while it imported torch"):
        ddp_lab.run(dist.get_rank, 2, timeout=1, echo=False)
    assert wait_until_gone(stopped, seconds=5) == []
    assert ddp_lab.run(dist.get_rank, 2, echo=False).values == [0, 1]  # a new one starts


def in_rank_dynamo_is_loaded() -> bool:
    import sys
    return "torch._dynamo" in sys.modules


def test_the_first_run_s_ranks_are_forked_with_torch_dynamo_loaded():
    """The server imports what DDP needs before it says "ready", so no call pays it after
    the first (the second call of a fresh kernel is as fast as the third), and no rank pays
    it itself (a short hang demo used to time out while DDP's constructor imported
    torch._dynamo in every rank)."""
    ddp_lab.shutdown()
    assert ddp_lab.run(in_rank_dynamo_is_loaded, 2, echo=False).values == [True, True]


def in_rank_wall_clock() -> float:
    return time.time()


def test_res_seconds_is_the_call_s_wall_time_fork_server_start_included(slow_new_server):
    """A new server's start is not on the run's clock (its timeout), but it is the call's
    time: ``res.seconds`` covers it, from the call to its return."""
    called = time.time()
    res = ddp_lab.run(in_rank_wall_clock, 2, timeout=1, echo=False)
    returned = time.time()
    assert max(res.values) - called > SLOW_START_S  # the ranks ran after the slow start
    assert max(res.values) - called - 0.01 <= res.seconds <= returned - called
