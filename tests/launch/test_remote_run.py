"""The other entry points of ranks on several hosts: ``ddp_lab.run(fn, hosts=...)`` (one
call, the one-shot run's errors), the magics' --hosts options, and ``via="slurm"`` for
real, on a private single-machine SLURM (tests/remote_slurm.py): the agent starts as a step
of srun, and a killed kernel's srun takes it and its ranks down."""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
import time

import psutil
import pytest
import remote_slurm
from remote_slurm import marked_processes, private_slurm

import ddp_lab
from ddp_lab.course import ssh_hosts
from ddp_lab.launch.errors import WorkerError
from ddp_lab.launch.live.magic_options import host_options
from ddp_lab.launch.magic import ddp, parse_magic_line
from ddp_lab.launch.remote.launchers import SLURM, agent_command, launcher_argv

SSH = ssh_hosts.ssh_support()
SLURM_MISSING = remote_slurm.missing()
pytestmark = pytest.mark.timeout(180)


def square(x):
    import torch.distributed as dist
    return (dist.get_rank(), x * x)


@pytest.mark.skipif(SSH is not None, reason=f"no ssh hosts: {SSH}")
def test_run_on_two_hosts_returns_each_ranks_value_and_raises_a_one_shot_error():
    with ssh_hosts.ssh_hosts(2) as bed:
        opts = dict(hosts=[h.name for h in bed.hosts], nproc_per_node=2,
                    via=f"ssh -F {shlex.quote(str(bed.config))} {{host}} {{command}}",
                    controller=bed.machine, backend="gloo")
        assert ddp_lab.run(square, 4, args=(3,), **opts).values == [(r, 9) for r in range(4)]
        with pytest.raises(WorkerError) as err:
            ddp_lab.run(divmod, 4, args=(1, 0), **opts)
        assert "ZeroDivisionError" in str(err.value)
        assert "live ranks" not in str(err.value) and "restart" not in str(err.value)


@pytest.mark.skipif(SSH is not None, reason=f"no ssh hosts: {SSH}")
def test_a_ddp_cell_runs_on_two_hosts_and_returns_its_names():
    with ssh_hosts.ssh_hosts(2) as bed:
        user_ns: dict = {}
        line = (f"-n 4 --hosts {','.join(h.name for h in bed.hosts)} --nproc-per-node 2 "
                f"--via {shlex.quote(bed.via)} --controller {bed.machine} --backend gloo "
                "--return where")
        ddp(line, "import os\nwhere = (rank, int(os.environ['GROUP_RANK']))", user_ns)
        assert user_ns["where"] == [(0, 0), (1, 0), (2, 1), (3, 1)]


def test_the_magics_pass_their_host_options_on():
    options = parse_magic_line("-n 4 --hosts node0,node1 --nproc-per-node 2 --via slurm "
                               "--controller 10.0.0.1")
    assert host_options(options) == dict(hosts=["node0", "node1"], nproc_per_node=2,
                                         via="slurm", controller="10.0.0.1")
    assert host_options(parse_magic_line("-n 2"))["hosts"] is None


def test_the_slurm_command_is_a_step_of_the_allocation_on_that_node():
    argv = launcher_argv(SLURM, "node7", agent_command(("10.0.0.1", 4242), 1))
    assert argv[:2] == ["srun", "--overlap"] and "--nodelist=node7" in argv
    assert argv[-3:-1] == ["/bin/sh", "-c"]
    command = shlex.split(argv[-1])
    assert command[-4:] == ["--connect", "10.0.0.1:4242", "--index", "1"]
    assert not any("secret" in word.lower() for word in argv)  # it goes down stdin


@pytest.mark.skipif(SLURM_MISSING is not None, reason=str(SLURM_MISSING))
def test_live_ranks_via_slurm_run_as_a_step_and_die_with_a_killed_kernel(tmp_path):
    with private_slurm() as slurm:
        script = tmp_path / "kernel.py"
        script.write_text(
            "import sys, time, ddp_lab\n"
            "ranks = ddp_lab.Ranks(2, hosts=[sys.argv[1]], via='slurm', backend='gloo',"
            " controller='127.0.0.1')\n"
            "print('values', ranks.exec('import os\\n(rank, os.environ.get(\"SLURM_STEP_ID\"))')"
            ".values, flush=True)\n"
            "time.sleep(600)\n")
        kernel = subprocess.Popen([sys.executable, str(script), slurm.node], env=slurm.env,
                                  stdout=subprocess.PIPE, text=True, start_new_session=True)
        try:
            while (line := kernel.stdout.readline()) and not line.startswith("values"):
                pass
            assert line.startswith("values [(0, '"), line  # each rank inside a step
            assert line.count("(") == 2
            agents = [p for p in _ours(slurm) if "ddp_lab.launch.remote.agent" in p.cmdline()]
            assert len(agents) == 1
            assert any("slurmstepd" in parent.name() for parent in agents[0].parents())
        finally:
            kernel.kill()
            kernel.wait()
        until = time.monotonic() + 20
        while _ours(slurm) and time.monotonic() < until:
            time.sleep(0.2)
        assert _ours(slurm) == []


def _ours(slurm) -> list:
    """This SLURM's processes that run ddp_lab (the agent, its fork server, the ranks)."""
    found = []
    for proc in marked_processes(str(slurm.folder)):
        try:
            if proc.pid != os.getpid() and any("ddp_lab" in word for word in proc.cmdline()):
                found.append(proc)
        except psutil.Error:
            pass
    return found
