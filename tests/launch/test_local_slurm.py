"""What ``via="slurm"`` stands on, checked on a private single-machine SLURM (tests/remote_slurm.py):
srun starts the tasks with the SLURM_* variables an agent reads its place from, a step inside
an allocation shares it with ``--overlap``, and killing srun kills its tasks (the stop
button's and a dead kernel's path to a remote agent)."""

from __future__ import annotations

import glob
import json
import os
import shlex
import signal
import socket
import subprocess
import sys
import time

import psutil
import pytest

import remote_slurm
from conftest import wait_until_gone
from remote_slurm import MARKER, has_marker, marked_processes, missing, private_slurm

pytestmark = pytest.mark.skipif(missing() is not None, reason=str(missing()))

SLURM_VARIABLES = ("SLURM_PROCID", "SLURM_LOCALID", "SLURM_NODEID", "SLURM_NODELIST",
                   "SLURM_JOB_ID", "SLURM_STEP_ID", "SLURM_STEP_NODELIST", "SLURM_NTASKS")
PRINT_VARIABLES = ("import json, os; print(json.dumps({k: os.environ.get(k) for k in "
                   f"{SLURM_VARIABLES!r}}}))")


@pytest.fixture
def slurm():
    """A private SLURM for one test: it starts in about 0.2 s, and the leak check after
    every test (tests/conftest.py) would count daemons kept across tests as leftovers."""
    started = time.monotonic()
    with private_slurm() as running:
        print(f"private SLURM up in {time.monotonic() - started:.2f} s")
        yield running


def task_variables(done: subprocess.CompletedProcess) -> list[dict]:
    assert done.returncode == 0, done.stderr
    return sorted((json.loads(line) for line in done.stdout.splitlines()),
                  key=lambda seen: int(seen["SLURM_PROCID"]))


def test_srun_starts_two_tasks_that_know_their_place(slurm):
    seen = task_variables(slurm.run("srun", "-N1", "-n2", sys.executable, "-c",
                                    PRINT_VARIABLES))
    assert [(v["SLURM_PROCID"], v["SLURM_LOCALID"], v["SLURM_NODEID"]) for v in seen] == [
        ("0", "0", "0"), ("1", "1", "0")]
    for variables in seen:
        assert variables["SLURM_NODELIST"] == variables["SLURM_STEP_NODELIST"] == slurm.node
        assert variables["SLURM_NTASKS"] == "2"
    assert seen[0]["SLURM_JOB_ID"] == seen[1]["SLURM_JOB_ID"]
    assert seen[0]["SLURM_JOB_ID"].isdigit()


def test_steps_in_an_allocation_share_its_job_and_overlap(slurm, tmp_path):
    """Inside ``salloc`` every srun is a step of the same job. A step that holds every CPU
    (here: two tasks waiting for a file) leaves no room for a second one, which SLURM queues
    ("Requested nodes are busy") until the first ends; with ``--overlap`` the second runs at
    once: it makes the file the first waits for, so the script ends only if it did."""
    flag = tmp_path / "flag"
    first = f"{wait_for(flag)}\n{PRINT_VARIABLES}"
    second = f"{PRINT_VARIABLES}; open({str(flag)!r}, 'w').close()"
    script = (f"srun -n2 {python(first)} & srun --overlap -n1 {python(second)}; wait")
    seen = task_variables(slurm.run("salloc", "-N1", f"-n{slurm.cpus}", "bash", "-c", script,
                                    timeout=60))
    assert len(seen) == 3
    assert len({v["SLURM_JOB_ID"] for v in seen}) == 1
    assert len({v["SLURM_STEP_ID"] for v in seen}) == 2


def python(code: str) -> str:
    return f"{shlex.quote(sys.executable)} -c {shlex.quote(code)}"


def wait_for(path) -> str:
    return f"import os, time\nwhile not os.path.exists({str(path)!r}): time.sleep(0.05)"


@pytest.mark.parametrize("inside", ["own job", "allocation"])
def test_killing_srun_kills_its_tasks(slurm, tmp_path, inside):
    """SIGKILL on srun (a kernel that dies, a launcher that is killed): slurmstepd loses
    srun's connection, cancels the step and kills its tasks; srun needs no chance to clean up."""
    task = python("import os, time\n"
                  + write_pid(tmp_path, "os.environ['SLURM_PROCID']", "os.getpid()")
                  + "time.sleep(300)")
    if inside == "own job":
        command = ["bash", "-c", f"exec srun -N1 -n2 {task}"]
    else:   # the launcher's case: a step of the user's allocation, beside their own steps
        command = ["salloc", "-N1", "-n2", "bash", "-c",
                   f"srun --overlap -n2 {task} & echo $! > {tmp_path}/srun; wait"]
    client = slurm.popen(*command, stderr=subprocess.DEVNULL)
    try:
        pids = task_pids(tmp_path, 2)
        srun = int((tmp_path / "srun").read_text()) if inside == "allocation" else client.pid
        killed = time.monotonic()
        os.kill(srun, signal.SIGKILL)
        assert wait_until_gone(pids, seconds=30) == [], "srun's tasks outlived it"
        print(f"tasks gone {time.monotonic() - killed:.2f} s after srun was killed")
    finally:
        client.kill()
        client.wait()


@pytest.mark.parametrize("proctrack", ["linuxproc", "cgroup"])
def test_a_child_in_a_session_of_its_own_dies_with_the_step(tmp_path, proctrack):
    """An agent's ranks may run in sessions of their own (a fork server's children). The
    step's end reaches them where the tracker follows descendants (linuxproc) or the cgroup
    (cgroup); proctrack/pgid signals only each task's process group and leaves them running
    (seen by hand on this machine: pgid misses a setsid child, linuxproc a double-forked one)."""
    if proctrack == "cgroup" and not os.path.isdir("/sys/fs/cgroup/freezer"):
        pytest.skip("proctrack/cgroup is configured here for cgroup v1's freezer")
    with private_slurm(proctrack=proctrack) as running:
        task = python("import os, subprocess, time\n"
                      "child = subprocess.Popen(['sleep', '300'], start_new_session=True)\n"
                      + write_pid(tmp_path, "'0'", "os.getpid()")
                      + write_pid(tmp_path, "'1'", "child.pid")
                      + "time.sleep(300)")
        client = running.popen("bash", "-c", f"exec srun -n1 {task}", stderr=subprocess.DEVNULL)
        try:
            pids = task_pids(tmp_path, 2)
            os.kill(client.pid, signal.SIGKILL)
            assert wait_until_gone(pids, seconds=30) == [], "a process outlived its step"
        finally:
            client.kill()
            client.wait()


def test_a_controller_that_cannot_start_says_why_and_leaves_nothing(monkeypatch):
    """slurmctld's port taken between its pick and the start: slurmctld gives up after its
    bind retries (about 5 s), the error carries its log, and what did start is stopped."""
    pick = remote_slurm._free_ports
    folders = set(glob.glob("/tmp/slurm-test-*"))
    with socket.socket() as taken:
        taken.bind(("", 0))
        taken.listen()
        port = taken.getsockname()[1]
        monkeypatch.setattr(remote_slurm, "_free_ports", lambda count: (port, *pick(count - 1)))
        with pytest.raises(RuntimeError, match="Address already in use"):
            with private_slurm():
                pass
    assert set(glob.glob("/tmp/slurm-test-*")) == folders
    assert [p for p in psutil.process_iter() if p.name() in ("munged", "slurmctld", "slurmd")
            and has_marker(p) and p.status() != psutil.STATUS_ZOMBIE] == []


def write_pid(folder, name: str, pid: str) -> str:
    """Python lines that write ``pid`` to ``folder/name`` whole (renamed into place)."""
    path = f"{str(folder)!r} + '/' + {name}"
    return (f"open({path} + '.part', 'w').write(str({pid}))\n"
            f"os.rename({path} + '.part', {path})\n")


def task_pids(folder, count: int, seconds: float = 30.0) -> list[int]:
    deadline = time.monotonic() + seconds
    while len(files := [f for f in folder.iterdir() if f.name.isdigit()]) < count:
        assert time.monotonic() < deadline, "srun's tasks did not start"
        time.sleep(0.05)
    return [int(f.read_text()) for f in files]


def test_the_private_slurm_leaves_nothing_even_with_a_step_running():
    with private_slurm() as running:
        client = running.popen("srun", "-n1", "sleep", "300", stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 30
        while "sleep" not in {p.name() for p in marked_processes(str(running.folder))}:
            assert time.monotonic() < deadline, "the step did not start"
            time.sleep(0.05)
    client.wait(timeout=30)
    assert marked_processes(str(running.folder)) == []
    assert not running.folder.exists()
    listening = {c.laddr.port for c in psutil.net_connections("inet") if c.status == "LISTEN"}
    assert not set(running.ports) & listening
    assert MARKER not in os.environ


def test_an_unknown_process_tracker_is_refused_before_anything_starts():
    with pytest.raises(ValueError, match="proctrack='none'"):
        with private_slurm(proctrack="none"):
            pass
