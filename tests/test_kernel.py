"""The launcher inside a real Jupyter kernel: live tagged output, the stop button, and a
kernel killed with SIGKILL. Nothing of the run may survive either."""

from __future__ import annotations

import textwrap
from pathlib import Path

import psutil
import pytest
from jupyter_client import KernelManager
from jupyter_client.kernelspec import KernelSpecManager

from conftest import wait_until_gone
from ddp_lab.notebook_runner import kernel_env
from test_faults import _wait_for_pids

pytestmark = pytest.mark.timeout(240)
TESTS = str(Path(__file__).parent)


def start_kernel(cwd: Path):
    manager = KernelManager(kernel_name="python3",
                            kernel_spec_manager=KernelSpecManager(kernel_dirs=[]))
    manager.start_kernel(env=kernel_env(), cwd=str(cwd),
                         extra_arguments=["--IPKernelApp.log_level=ERROR"])
    client = manager.client()
    client.start_channels()
    client.wait_for_ready(timeout=120)
    return manager, client


def execute(client, code: str, timeout: float = 120) -> tuple[dict, str]:
    """Run a cell; return its execute_reply content and everything it printed."""
    msg_id = client.execute(textwrap.dedent(code))
    printed = []
    while True:
        msg = client.get_iopub_msg(timeout=timeout)
        if msg["parent_header"].get("msg_id") != msg_id:
            continue
        if msg["msg_type"] == "stream":
            printed.append(msg["content"]["text"])
        if msg["msg_type"] == "status" and msg["content"]["execution_state"] == "idle":
            break
    reply = client.get_shell_msg(timeout=timeout)
    return reply["content"], "".join(printed)


def test_kernel_output_interrupt_and_sigkill(tmp_path):
    manager, client = start_kernel(tmp_path)
    try:
        reply, printed = execute(client, f"""
            import sys; sys.path.insert(0, {TESTS!r})
            import ddp_lab, ddp_lab.demos.launching, workers
            res = ddp_lab.run(ddp_lab.demos.launching.hello, world_size=2)
            assert [v["rank"] for v in res.values] == [0, 1]
        """)
        assert reply["status"] == "ok", reply
        assert "[rank 1] rank: 1, world_size: 2" in printed

        _interrupt_stops_every_rank(manager, client, tmp_path / "interrupted")
        _sigkill_of_kernel_stops_every_rank(manager, client, tmp_path / "killed")
    finally:
        client.stop_channels()
        manager.shutdown_kernel(now=True)


def _interrupt_stops_every_rank(manager, client, folder: Path) -> None:
    folder.mkdir()
    msg_id = client.execute(f"ddp_lab.run(workers.write_pid_and_sleep, 3, args=({str(folder)!r},), timeout=600)")
    pids = _wait_for_pids(folder, 3)
    manager.interrupt_kernel()
    reply = client.get_shell_msg(timeout=60)
    assert reply["parent_header"]["msg_id"] == msg_id
    assert reply["content"]["ename"] == "KeyboardInterrupt"
    assert wait_until_gone(pids, seconds=5) == []
    reply, _ = execute(client, "assert ddp_lab.run(workers.rank_and_env, 2, echo=False)[1]['rank'] == 1")
    assert reply["status"] == "ok", reply  # the kernel and its fork server still work


def _sigkill_of_kernel_stops_every_rank(manager, client, folder: Path) -> None:
    folder.mkdir()
    client.execute(f"ddp_lab.run(workers.write_pid_and_sleep, 2, args=({str(folder)!r},), timeout=600)")
    pids = _wait_for_pids(folder, 2)
    kernel = psutil.Process(manager.provisioner.process.pid)
    helpers = [p.pid for p in kernel.children(recursive=True)]
    kernel.kill()
    assert wait_until_gone(pids + helpers, seconds=10) == []
