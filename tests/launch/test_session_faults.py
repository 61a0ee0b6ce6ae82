"""Failures: the right error, the right rank, and nothing left behind (see conftest)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import psutil
import pytest
import torch

import ddp_lab
import workers
from conftest import wait_until_gone
from run_probes import run_folders_of, wait_for_pids

pytestmark = pytest.mark.timeout(120)


def test_crash_names_root_cause_rank_and_marks_knock_on():
    with pytest.raises(ddp_lab.WorkerError) as info:
        ddp_lab.run(workers.raise_on, world_size=4, args=(2,), echo=False)
    err = info.value
    assert err.rank == 2 and err.exitcode == 1
    assert "KeyError: 'no such batch'" in err.traceback
    assert "in raise_on" in err.traceback and "_run_target" not in err.traceback
    assert set(err.knock_on) == {0, 1, 3}
    assert str(err).startswith("rank 2 failed")
    assert "KeyError" in err.logs[2] and len(err.logs) == 4
    assert isinstance(err, ddp_lab.DistributedRunError) and isinstance(err, RuntimeError)


def test_segfault_is_reported_with_its_python_stack():
    with pytest.raises(ddp_lab.WorkerError) as info:
        ddp_lab.run(workers.segfault_on, world_size=3, args=(1,), echo=False)
    err = info.value
    assert err.rank == 1 and err.exitcode == -signal.SIGSEGV
    assert "Segmentation fault" in err.traceback and "in segfault_on" in err.traceback
    assert "killed by SIGSEGV" in str(err)


def test_rank_that_returns_early_is_explained():
    with pytest.raises(ddp_lab.WorkerError) as info:
        ddp_lab.run(workers.exit_early_on, world_size=3, args=(0,), echo=False)
    assert "Rank 0 returned while the others still waited" in str(info.value)


def test_hang_times_out_with_each_stuck_rank_stack():
    start = time.monotonic()
    with pytest.raises(ddp_lab.WorkerTimeout) as info:
        ddp_lab.run(workers.stuck_in_all_reduce_unless_rank0, world_size=3, timeout=2,
                    echo=False)
    err = info.value
    assert err.stuck_ranks == [0, 1, 2]
    assert "time.sleep(3600)" in err.stacks[0]
    for rank in (1, 2):
        assert "in all_reduce" in err.stacks[rank]
        assert "dist.all_reduce(torch.ones(1))" in err.stacks[rank]
        assert "ddp_lab-lifeline" not in err.stacks[rank] and "in watch" not in err.stacks[rank]
    assert time.monotonic() - start < 60


def test_timeout_names_only_the_ranks_still_running():
    def rank0_sleeps():
        if torch.distributed.get_rank() == 0:
            time.sleep(3600)
    with pytest.raises(ddp_lab.WorkerTimeout) as info:
        ddp_lab.run(rank0_sleeps, world_size=2, timeout=1.5, echo=False)
    assert info.value.stuck_ranks == [0]
    assert "ranks [1] had finished" in str(info.value)


def test_children_of_a_rank_are_cleaned_up(tmp_path):
    with pytest.raises(ddp_lab.WorkerTimeout):
        ddp_lab.run(workers.spawn_child_and_sleep, 2, args=(str(tmp_path),), timeout=3,
                    echo=False)
    pids = [int(p.read_text()) for p in tmp_path.glob("*.pid")]
    assert len(pids) == 4
    assert wait_until_gone(pids) == []


def test_keyboard_interrupt_kills_every_rank_and_reraises(tmp_path):
    def interrupt_when_started():
        while len(list(tmp_path.glob("rank*.pid"))) < 3:
            time.sleep(0.05)
        os.kill(os.getpid(), signal.SIGINT)

    threading.Thread(target=interrupt_when_started, daemon=True).start()
    with pytest.raises(KeyboardInterrupt):
        ddp_lab.run(workers.write_pid_and_sleep, 3, args=(str(tmp_path),), timeout=60,
                    echo=False)
    pids = [int(p.read_text()) for p in tmp_path.glob("rank*.pid")]
    assert wait_until_gone(pids, seconds=1.0) == []


LAUNCHER = textwrap.dedent("""
    import sys
    sys.path.insert(0, {tests!r})
    import ddp_lab, workers
    ddp_lab.run(workers.write_pid_and_sleep, 2, args=({folder!r},), timeout=600)
""")


def test_sigkill_of_the_launcher_takes_the_ranks_down(tmp_path):
    code = LAUNCHER.format(tests=str(Path(__file__).parents[1]), folder=str(tmp_path))
    launcher = subprocess.Popen([sys.executable, "-c", code])
    try:
        pids = wait_for_pids(tmp_path, 2)
        server = [p.pid for p in psutil.Process(launcher.pid).children()]
    finally:
        launcher.kill()
        launcher.wait()
    assert wait_until_gone(pids + server, seconds=10) == []
    assert run_folders_of(launcher.pid) == []  # the fork server removed it


def test_a_dead_fork_server_is_replaced():
    ddp_lab.run(workers.rank_and_env, 1, echo=False)
    os.kill(ddp_lab.launch.forkserver.client.fork_server_pid(), signal.SIGKILL)
    time.sleep(0.5)
    assert ddp_lab.run(workers.rank_and_env, 2, echo=False)[1]["rank"] == 1


def test_ranks_failing_on_their_own_are_not_called_knock_on():
    def everyone_fails():  # each its own way (the same error everywhere is told once)
        rank = torch.distributed.get_rank()
        raise [ValueError, KeyError, TypeError][rank](f"rank {rank} has a bug too")
    with pytest.raises(ddp_lab.WorkerError) as info:
        ddp_lab.run(everyone_fails, world_size=3, echo=False)
    err = info.value
    assert err.knock_on == {} and set(err.also_failed) == {0, 1, 2} - {err.rank}
    assert "failed on their own as well" in str(err)


def test_env_is_seen_by_torch_settings_read_at_import():
    def debug_level():
        return str(torch.distributed.get_debug_level())
    res = ddp_lab.run(debug_level, world_size=1, env={"TORCH_DISTRIBUTED_DEBUG": "DETAIL"},
                      echo=False)
    assert res[0].endswith("DETAIL")
