"""A private single-machine SLURM for the tests of ``via="slurm"``: Debian's munged, slurmctld
and slurmd (slurm-wlm 22.05), started by hand from a slurm.conf in a temp folder of their own
(a container has no systemd to start them), and stopped with everything they started.

The daemons run in the foreground as children of the test (``-D``, ``-F``), so they are
waited for and never reparented; the step daemons (slurmstepd) that slurmd starts for each
job step do leave its tree, so every process started here carries ``MARKER`` in its
environment (slurmd hands its own to slurmstepd; clients run with ``LocalSlurm.env``) and the
stop finds them by it, as tests/conftest.py finds a run's strays.

What it leaves open: slurmctld and slurmd listen on all interfaces (slurm.conf has no bind
address), on two free ports picked here, for as long as the context lasts; munge's key is
root's alone (0600 in a 0700 folder); its socket sits in a folder every user may traverse,
which munged requires (``execute permissions for all required``).
https://slurm.schedmd.com/slurm.conf.html, munged(8)
"""

from __future__ import annotations

import glob
import os
import shutil
import socket
import subprocess
import tempfile
import time
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path

import psutil

# Debian 12: apt-get install --no-install-recommends slurmd slurmctld slurm-client munge
PROGRAMS = ("mungekey", "munged", "slurmctld", "slurmd", "srun", "salloc", "sinfo", "squeue",
            "scancel")
PACKAGES = "slurmd slurmctld slurm-client munge"
MARKER = "DDP_LAB_TEST_SLURM"
PROCTRACK = ("linuxproc", "pgid", "cgroup")
READY_S = 30.0
STOP_S = 10.0


def missing() -> str | None:
    """Why a private SLURM cannot start on this machine (a test's skip reason), or None."""
    if os.geteuid() != 0:
        return "a private SLURM needs root (slurmd starts each task as its user)"
    absent = [name for name in PROGRAMS if shutil.which(name) is None]
    if absent:
        return (f"{', '.join(absent)} not installed: "
                f"apt-get install --no-install-recommends {PACKAGES}")
    return None


@dataclass(frozen=True)
class LocalSlurm:
    """A running private SLURM: its folder, its one node, and the environment its clients
    (srun, salloc, sinfo) need to reach it."""
    folder: Path
    node: str
    cpus: int
    ports: tuple[int, int]          # slurmctld's, slurmd's
    env: dict[str, str]

    def run(self, *command: str, timeout: float = 60.0) -> subprocess.CompletedProcess:
        """A client command (``"srun", "-n2", ...``) to its end; its output as text."""
        return subprocess.run(command, env=self.env, capture_output=True, text=True,
                              timeout=timeout)

    def popen(self, *command: str, **kwargs) -> subprocess.Popen:
        return subprocess.Popen(command, env=self.env, **kwargs)


@contextmanager
def private_slurm(cpus: int = 2, proctrack: str = "linuxproc"):
    """Start munged, slurmctld and slurmd on this machine; yield a LocalSlurm; stop them,
    every job step and task they started, and remove their folder (and the cgroups of
    ``proctrack="cgroup"``), whatever happened in between."""
    if (problem := missing()) is not None:
        raise RuntimeError(problem)
    if proctrack not in PROCTRACK:
        raise ValueError(f"proctrack={proctrack!r}: one of {PROCTRACK}")
    with ExitStack() as stack:
        folder = Path(tempfile.mkdtemp(prefix="slurm-test-"))
        stack.callback(shutil.rmtree, folder, ignore_errors=True)
        folder.chmod(0o711)                      # munged: its socket's folders traversable
        node = socket.gethostname().split(".")[0]
        stack.callback(_remove_new_cgroups, node, _cgroups(node))
        env = {**os.environ, "SLURM_CONF": str(folder / "slurm.conf"), MARKER: str(folder)}
        stack.callback(_kill_marked, str(folder))
        stack.callback(_stop, _start_munged(folder, env))
        ports = _free_ports(2)
        _write_conf(folder, node, cpus, ports, proctrack)
        daemons = []
        for name, port in (("slurmctld", ports[0]), ("slurmd", ports[1])):
            # one after the other: a slurmd that finds no controller registers a second later
            daemons.append(_start_daemon(folder, name, env))
            stack.callback(_stop, daemons[-1])
            _wait_for(lambda: _accepts(port), daemons[-1], folder / "log" / f"{name}.out")
        slurm = LocalSlurm(folder, node, cpus, ports, env)
        stack.callback(_cancel_jobs, slurm)
        _wait_ready(slurm, daemons)
        yield slurm


def _start_munged(folder: Path, env: dict) -> subprocess.Popen:
    munge = folder / "munge"
    run = folder / "run"
    munge.mkdir(mode=0o700)
    run.mkdir(mode=0o711)
    subprocess.run(["mungekey", "--create", f"--keyfile={munge / 'munge.key'}"], check=True,
                   capture_output=True, timeout=30)
    command = ["munged", "--foreground", f"--key-file={munge / 'munge.key'}",
               f"--socket={run / 'munge.sock'}", f"--pid-file={munge / 'munged.pid'}",
               f"--log-file={munge / 'munged.log'}", f"--seed-file={munge / 'prng.state'}"]
    munged = _spawn(command, munge / "munged.out", env)
    _wait_for(lambda: (run / "munge.sock").exists(), munged, munge / "munged.log")
    return munged


def _start_daemon(folder: Path, name: str, env: dict) -> subprocess.Popen:
    return _spawn([name, "-D", "-f", str(folder / "slurm.conf")],
                  folder / "log" / f"{name}.out", env)


def _spawn(command: list[str], log: Path, env: dict) -> subprocess.Popen:
    log.parent.mkdir(mode=0o700, exist_ok=True)
    with open(log, "wb") as out:
        return subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, env=env,
                                stdin=subprocess.DEVNULL)


def _write_conf(folder: Path, node: str, cpus: int, ports: tuple[int, int],
                proctrack: str) -> None:
    """The smallest slurm.conf that runs steps here: no accounting, no task binding, state
    and spool in the folder. ``MessageTimeout`` is short so that a client of a stopped
    controller fails in seconds instead of retrying for minutes."""
    for sub in ("state", "spool", "log"):
        (folder / sub).mkdir(mode=0o700, exist_ok=True)
    lines = [
        "ClusterName=ddplabtest", f"SlurmctldHost={node}(127.0.0.1)",
        "SlurmUser=root", "SlurmdUser=root",
        f"SlurmctldPort={ports[0]}", f"SlurmdPort={ports[1]}",
        "AuthType=auth/munge", "CredType=cred/munge",
        f"AuthInfo=socket={folder / 'run' / 'munge.sock'}",
        f"StateSaveLocation={folder / 'state'}", f"SlurmdSpoolDir={folder / 'spool'}",
        f"SlurmctldPidFile={folder / 'slurmctld.pid'}", f"SlurmdPidFile={folder / 'slurmd.pid'}",
        f"SlurmctldLogFile={folder / 'log' / 'slurmctld.log'}",
        f"SlurmdLogFile={folder / 'log' / 'slurmd.log'}",
        f"ProctrackType=proctrack/{proctrack}", "TaskPlugin=task/none",
        "JobAcctGatherType=jobacct_gather/none",
        "AccountingStorageType=accounting_storage/none", "JobCompType=jobcomp/none",
        "SelectType=select/cons_tres", "SelectTypeParameters=CR_Core", "MpiDefault=none",
        "ReturnToService=2", "MessageTimeout=5", "KillWait=5",
        f"NodeName={node} NodeAddr=127.0.0.1 CPUs={cpus} State=UNKNOWN",
        f"PartitionName=test Nodes={node} Default=YES MaxTime=INFINITE State=UP",
    ]
    (folder / "slurm.conf").write_text("\n".join(lines) + "\n")
    if proctrack == "cgroup":   # cgroup v1, as mounted on the test machine
        (folder / "cgroup.conf").write_text("CgroupPlugin=cgroup/v1\n"
                                            "CgroupMountpoint=/sys/fs/cgroup\n")


def _free_ports(count: int) -> tuple[int, ...]:
    """Ports free right now (the kernel's pick); held together so that they differ."""
    with ExitStack() as stack:
        socks = [stack.enter_context(socket.socket()) for _ in range(count)]
        for sock in socks:
            sock.bind(("", 0))
        return tuple(sock.getsockname()[1] for sock in socks)


def _wait_ready(slurm: LocalSlurm, daemons: list[subprocess.Popen]) -> None:
    """Until sinfo reports the node idle; a daemon that exits first fails with its log."""
    deadline = time.monotonic() + READY_S
    while time.monotonic() < deadline:
        for proc in daemons:
            if proc.poll() is not None:
                raise RuntimeError(f"{proc.args[0]} exited ({proc.returncode}) at start:\n"
                                   + _tail(slurm.folder / "log" / f"{proc.args[0]}.out"))
        if _node_state(slurm) == "idle":
            return
        time.sleep(0.1)
    raise RuntimeError(f"the private SLURM's node is not idle after {READY_S:.0f} s:\n"
                       + _tail(slurm.folder / "log" / "slurmctld.log"))


def _accepts(port: int) -> bool:
    """Whether a daemon listens yet: a client or a slurmd that finds no controller
    listening tries again a second later, which was most of the start."""
    with socket.socket() as probe:
        return probe.connect_ex(("127.0.0.1", port)) == 0


def _node_state(slurm: LocalSlurm) -> str:
    try:
        done = slurm.run("sinfo", "-h", "-n", slurm.node, "-o", "%T", timeout=5)
    except subprocess.TimeoutExpired:
        return ""
    return done.stdout.strip()


def _wait_for(ready, proc: subprocess.Popen, log: Path) -> None:
    deadline = time.monotonic() + READY_S
    while not ready():
        if proc.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"{proc.args[0]} did not start (exit code {proc.poll()}):\n"
                               + _tail(log))
        time.sleep(0.05)


def _tail(path: Path, lines: int = 20) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError as error:
        return f"(no log: {error})"


def _cancel_jobs(slurm: LocalSlurm) -> None:
    """Every job still queued or running, cancelled while the controller can still do it;
    waits (bounded) until the queue is empty and every step daemon has reported its end (a
    step daemon that outlives the controller retries that report for minutes)."""
    deadline = time.monotonic() + STOP_S
    while time.monotonic() < deadline:
        try:
            jobs = slurm.run("squeue", "-h", "-o", "%i", timeout=5).stdout.split()
            if jobs:
                slurm.run("scancel", *jobs, timeout=5)
        except subprocess.TimeoutExpired:
            return
        if not jobs and not _step_daemons(str(slurm.folder)):
            return
        time.sleep(0.2)


def _stop(proc: subprocess.Popen) -> None:
    proc.terminate()
    try:
        proc.wait(STOP_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def _kill_marked(folder: str) -> None:
    """Kill every process that carries this SLURM's marker (step daemons, their tasks, a
    client a test left) and wait until they are gone."""
    marked = marked_processes(folder)
    for proc in marked:
        try:
            proc.kill()
        except psutil.Error:
            pass
    psutil.wait_procs(marked, timeout=STOP_S)


def marked_processes(folder: str) -> list[psutil.Process]:
    """Live processes started by (or for) the private SLURM in ``folder``: those with its
    marker, and its step daemons, whose environment reads empty (slurmstepd writes its
    title over it) but which hold slurmd's log open."""
    return [proc for proc in psutil.process_iter()
            if _alive(proc) and (has_marker(proc, folder) or _is_step_daemon(proc, folder))]


def _step_daemons(folder: str) -> list[psutil.Process]:
    return [proc for proc in psutil.process_iter()
            if _alive(proc) and _is_step_daemon(proc, folder)]


def has_marker(proc: psutil.Process, folder: str | None = None) -> bool:
    """Whether ``proc`` was started by (or for) the private SLURM in ``folder`` (any, if
    None)."""
    try:
        found = proc.environ().get(MARKER)
    except psutil.Error:
        return False
    return found is not None and folder in (None, found)


def _is_step_daemon(proc: psutil.Process, folder: str) -> bool:
    try:
        return (proc.name().startswith("slurmstepd")
                and any(f.path.startswith(folder + os.sep) for f in proc.open_files()))
    except psutil.Error:
        return False


def _alive(proc: psutil.Process) -> bool:
    try:
        return proc.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def _cgroups(node: str) -> set[str]:
    """slurmd's cgroups of this node (proctrack/cgroup makes them; nothing else does)."""
    return set(glob.glob(f"/sys/fs/cgroup/*/slurm_{node}"))


def _remove_new_cgroups(node: str, before: set[str]) -> None:
    """The cgroups slurmd made for the node, innermost first (a cgroup goes with rmdir once
    its children and tasks are gone)."""
    for top in sorted(_cgroups(node) - before):
        for path, _, _ in os.walk(top, topdown=False):
            try:
                os.rmdir(path)
            except OSError:
                pass
