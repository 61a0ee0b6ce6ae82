"""A new fork server imports torch before it forks anything: seconds on a quiet machine, many
more on busy cores. That time is not the run's: a run starts its clock once the server is
ready, and a server that never gets ready is killed, not waited for forever."""

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


def test_after_the_first_run_ranks_are_forked_with_torch_dynamo_loaded():
    """The server imports what DDP needs as soon as its first run is over, and the next run
    waits for that: its ranks never pay the import (a short hang demo used to time out
    while DDP's constructor imported torch._dynamo in every rank)."""
    ddp_lab.shutdown()
    first = ddp_lab.run(in_rank_dynamo_is_loaded, 2, echo=False).values
    second = ddp_lab.run(in_rank_dynamo_is_loaded, 2, echo=False).values
    assert first == [False, False] and second == [True, True]
