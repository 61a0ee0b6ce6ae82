"""Every test must leave nothing behind: no worker process, no listening port, no run folder.

The fork servers are the processes a launcher keeps (the launcher's, started once and
reused: one for plain runs, one for shaped ones); everything it forked must be gone when a test ends.
"""

from __future__ import annotations

import glob
import os
import signal
import tempfile
import time

import psutil
import pytest

from ddp_lab.launch.spawner import launcher_pids


def leftover_processes() -> list[psutil.Process]:
    """Descendants that are neither a launcher meant to stay (our fork server, a Jupyter
    kernel a module fixture keeps for several tests, that kernel's fork server) nor dead:
    a rank process is never meant to stay."""
    keep = launcher_pids()
    return [p for p in psutil.Process().children(recursive=True)
            if p.pid not in keep and _alive(p) and not _is_kept_kernel(p)]


def _is_kept_kernel(process: psutil.Process) -> bool:
    try:
        if "ipykernel_launcher" in process.cmdline():
            return True
        parent = process.parent()
        return "ddp_lab.launch.zygote" in process.cmdline() and "ipykernel_launcher" in parent.cmdline()
    except psutil.Error:
        return False


def _alive(process: psutil.Process) -> bool:
    try:
        return process.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def wait_until_gone(pids, seconds: float = 10.0) -> list[int]:
    """The pids still alive (zombies count as gone) after waiting up to ``seconds``."""
    deadline = time.monotonic() + seconds
    while True:
        alive = [pid for pid in pids if _pid_alive(pid)]
        if not alive or time.monotonic() > deadline:
            return alive
        time.sleep(0.1)


def _pid_alive(pid: int) -> bool:
    try:
        return _alive(psutil.Process(pid))
    except psutil.NoSuchProcess:  # it may vanish between any two calls
        return False


def strays() -> list[psutil.Process]:
    """Processes that are no descendants of ours (a helper that moved to a session of its
    own and lost its parent ends up under init) yet run in one of our run folders."""
    prefix = os.path.join(tempfile.gettempdir(), f"ddp_lab-{os.getpid()}-")
    ours = {p.pid for p in psutil.Process().children(recursive=True)}
    found = []
    for process in psutil.process_iter():
        try:
            env = process.environ() if process.pid not in ours else {}
            if env.get("DDP_LAB_RUN_DIR", "").startswith(prefix) and _alive(process):
                found.append(process)
        except psutil.Error:
            pass
    return found


def pytest_configure(config):
    """The interrupt tests need Python's own SIGINT handler. A shell that starts the suite as
    a background job (``cmd &`` in a script, nohup) hands it SIGINT ignored, and Python then
    keeps it ignored: every Ctrl-C test would fail for a reason that is not the launcher's.
    https://www.gnu.org/software/bash/manual/html_node/Signals.html"""
    if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


def pytest_addoption(parser):
    parser.addoption("--stress-runs", type=int, default=None,
                     help="runs of tests/launch/test_stress.py (default: "
                          "$DDP_LAB_STRESS_RUNS, else 200)")


def run_folders() -> set[str]:
    """Run folders of launches made by this test process (others may be running too)."""
    return set(glob.glob(os.path.join(tempfile.gettempdir(), f"ddp_lab-{os.getpid()}-*")))


def abandoned_run_folders() -> set[str]:
    """Folders named like a run folder (``ddp_lab-PID-*``) whose process is gone, so nobody
    will remove them: a notebook kernel's or a script's, not only this test process's."""
    found = set()
    for path in glob.glob(os.path.join(tempfile.gettempdir(), "ddp_lab-*-*")):
        pid = os.path.basename(path).split("-")[1]
        if pid.isdigit() and not _pid_alive(int(pid)):
            found.add(path)
    return found


def torch_temp_leftovers() -> set[str]:
    """torchrun's default log folders (every torchrun started without --log-dir makes one),
    and the traceback files of torch's spawn (``pytorch-errorfile-*.pickle``, one per failed
    worker, never removed by torch)."""
    return set(glob.glob(os.path.join(tempfile.gettempdir(), "torchelastic_*"))
               + glob.glob(os.path.join(tempfile.gettempdir(), "pytorch-errorfile-*")))


@pytest.fixture(autouse=True)
def nothing_left_behind():
    folders_before = run_folders()
    abandoned_before = abandoned_run_folders()
    torch_leftovers_before = torch_temp_leftovers()
    yield
    deadline = time.monotonic() + 10
    while (leftover_processes() or strays()) and time.monotonic() < deadline:
        time.sleep(0.1)
    left = leftover_processes() + strays()
    assert not left, f"processes left behind: {[(p.pid, p.cmdline()) for p in left]}"
    listening = [c for c in psutil.Process().net_connections("inet") if c.status == "LISTEN"]
    assert not listening, f"ports left listening: {listening}"
    assert run_folders() <= folders_before, "a ddp_lab run folder was left behind"
    abandoned = abandoned_run_folders() - abandoned_before
    assert not abandoned, f"folders of exited processes left behind: {sorted(abandoned)}"
    new_logs = torch_temp_leftovers() - torch_leftovers_before
    assert not new_logs, f"a torchrun or spawn left {sorted(new_logs)} in the temp folder"
