"""Live ranks in a real Jupyter kernel: ``%ddp_ranks`` and ``%%ranks`` cells, output under
the cell that ran, values shown per rank, and a kernel SIGKILLed while its ranks hold state
(every rank gone within seconds, no run folder left)."""

from __future__ import annotations

from pathlib import Path

import psutil
import pytest

from conftest import wait_until_gone
from kernel_helpers import execute, start_kernel
from run_probes import run_folders_of

pytestmark = pytest.mark.timeout(240)


def test_magics_keep_state_across_cells_and_a_killed_kernel_takes_its_ranks(tmp_path):
    manager, client = start_kernel(tmp_path)
    try:
        run = execute(client, "%load_ext ddp_lab\n%ddp_ranks -n 2 --timeout 30")
        assert run.ok, run.error
        run = execute(client, "%%ranks\nimport os\nw = torch.ones(2) * (rank + 1)\n"
                              "print('pid', os.getpid())\nw.sum().item()")
        assert run.ok, run.error
        assert "[rank 0] pid" in run.printed and "[rank 1] pid" in run.printed
        assert "[rank 0] Out: 2.0" in run.printed and "[rank 1] Out: 4.0" in run.printed
        pids = [int(line.split()[-1]) for line in run.printed.splitlines() if " pid " in line]

        run = execute(client, "%%ranks --on 1\nw.tolist()")
        assert run.ok, run.error
        assert run.printed.strip() == "[rank 1] Out: [2.0, 2.0]"

        run = execute(client, "%%ranks\nundefined_here")
        assert not run.ok and run.error["ename"] == "WorkerError"
        assert "keep their namespaces" in "\n".join(run.error["traceback"])

        run = execute(client, "%%ranks --help\n# the cell is not run")
        assert run.ok and "--on" in run.printed

        kernel = psutil.Process(manager.provisioner.process.pid)
        helpers = [p.pid for p in kernel.children(recursive=True)]
        assert set(pids) <= set(helpers)
        kernel.kill()
        assert wait_until_gone(pids + helpers, seconds=10) == []
        assert run_folders_of(kernel.pid) == []
    finally:
        client.stop_channels()
        manager.shutdown_kernel(now=True)


def test_ranks_close_when_the_kernel_shuts_down(tmp_path):
    manager, client = start_kernel(tmp_path)
    try:
        run = execute(client, "import ddp_lab, os\nranks = ddp_lab.Ranks(2, echo=False)\n"
                              "print(ranks.exec('import os; os.getpid()').values)")
        assert run.ok, run.error
        pids = [int(p) for p in run.printed.strip(" []\n").split(",")]
        kernel_pid = manager.provisioner.process.pid
    finally:
        client.stop_channels()
        manager.shutdown_kernel(now=False)  # a clean shutdown: the kernel's exit handlers run
    assert wait_until_gone(pids, seconds=10) == []
    assert run_folders_of(kernel_pid) == []
