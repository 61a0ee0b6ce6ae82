"""The launcher inside a real Jupyter kernel: live tagged output, the stop button, and a
kernel killed with SIGKILL. Nothing of the run may survive either."""

from __future__ import annotations

from pathlib import Path

import psutil
import pytest

from conftest import wait_until_gone
from kernel_helpers import execute, interrupt, start_kernel
from run_probes import run_folders_of, wait_for_pids

pytestmark = pytest.mark.timeout(240)
TESTS = str(Path(__file__).parents[1])


def test_kernel_output_interrupt_and_sigkill(tmp_path):
    manager, client = start_kernel(tmp_path)
    try:
        run = execute(client, f"""
            import sys; sys.path.insert(0, {TESTS!r})
            import ddp_lab, ddp_lab.course.ch00_launching.launching, workers
            res = ddp_lab.run(ddp_lab.course.ch00_launching.launching.hello, world_size=2)
            assert [v["rank"] for v in res.values] == [0, 1]
        """)
        assert run.ok, run.reply
        assert "[rank 1] rank: 1, world_size: 2" in run.printed

        _interrupt_stops_every_rank(manager, client, tmp_path / "interrupted")
        _sigkill_of_kernel_stops_every_rank(manager, client, tmp_path / "killed")
    finally:
        client.stop_channels()
        manager.shutdown_kernel(now=True)


def _interrupt_stops_every_rank(manager, client, folder: Path) -> None:
    folder.mkdir()
    msg_id = client.execute(f"ddp_lab.run(workers.write_pid_and_sleep, 3, args=({str(folder)!r},), timeout=600)")
    pids = wait_for_pids(folder, 3)
    reply = interrupt(manager, client, msg_id)
    assert reply["ename"] == "KeyboardInterrupt"
    assert wait_until_gone(pids, seconds=5) == []
    run = execute(client, "assert ddp_lab.run(workers.rank_and_env, 2, echo=False)[1]['rank'] == 1")
    assert run.ok, run.reply  # the kernel and its fork server still work


def _sigkill_of_kernel_stops_every_rank(manager, client, folder: Path) -> None:
    folder.mkdir()
    client.execute(f"ddp_lab.run(workers.write_pid_and_sleep, 2, args=({str(folder)!r},), timeout=600)")
    pids = wait_for_pids(folder, 2)
    kernel = psutil.Process(manager.provisioner.process.pid)
    helpers = [p.pid for p in kernel.children(recursive=True)]
    kernel.kill()
    assert wait_until_gone(pids + helpers, seconds=10) == []
    assert run_folders_of(kernel.pid) == []
