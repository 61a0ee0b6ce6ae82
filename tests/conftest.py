"""Every test must leave nothing behind: no worker process, no listening port, no run folder.

The fork servers are the processes a launcher keeps (the launcher's, started once and
reused: one for plain runs, one for shaped ones); everything it forked must be gone when a test ends.

The checks of ports and folders are cheap and run after every test. The checks of processes
walk every process on the machine, so they run only where a process may have been started:
when the kernel's count of tasks created since boot (threads too) has moved since the last
clean check began, or the launcher's fork servers changed. Otherwise the process table holds
the same processes it held at that check, which found none left; the ~700 tests that start
nothing (the layout rules among them) skip the walk. tests/test_leak_check.py proves that a
leaked process, port or run folder still fails its test.

`make test` runs the suite on two pytest-xdist workers. What each test checks of its own
(descendants, ports, run folders named by its pid) is the worker's alone; what it checks of
the whole machine (folders of exited processes, torch's temp files) waits out the grace
period, so another worker's launcher that is still cleaning up is not blamed; and a test that
watches machine-wide state (/dev/shm, the leak check's own proof) is marked ``alone`` and runs
while no other test does (:class:`MachineLock`).
"""

from __future__ import annotations

import fcntl
import glob
import os
import signal
import tempfile
import time
from dataclasses import dataclass

import psutil
import pytest

import ddp_lab
from ddp_lab.launch.forkserver.client import launcher_pids
from ddp_lab.launch.forkserver.store_host import HOST_NAME
from slow import is_slow

pytest_plugins = ("pytester",)  # tests/test_leak_check.py runs the fixture on leaky tests


def leftover_processes() -> list[psutil.Process]:
    """Descendants that are neither a launcher meant to stay (our fork server, a Jupyter
    kernel a module fixture keeps for several tests, that kernel's fork server) nor dead:
    a rank process is never meant to stay."""
    keep = launcher_pids()
    return [p for p in psutil.Process().children(recursive=True)
            if p.pid not in keep and _alive(p) and not _is_kept_kernel(p)]


def _is_kept_kernel(process: psutil.Process) -> bool:
    """A kept kernel, its fork server, or that server's store host."""
    try:
        if "ipykernel_launcher" in process.cmdline():
            return True
        parent = process.parent()
        if process.name() == HOST_NAME:
            return _is_kept_kernel(parent)
        return ("ddp_lab.launch.forkserver.server" in process.cmdline()
                and "ipykernel_launcher" in parent.cmdline())
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
    # read when test_interrupts_stress.py is imported (repeats.py)
    if config.getoption("--stress-runs"):
        os.environ["DDP_LAB_STRESS_RUNS"] = str(config.getoption("--stress-runs"))


@pytest.hookimpl(tryfirst=True)  # before -m deselects by marker
def pytest_collection_modifyitems(config, items):
    """The integration tier measured slow (tests/slow.py) gets its marker here.

    `make test` hands whole files to its two workers (``--dist loadfile``; pytest-xdist
    queues them by their number of tests, most first), so one worker runs the notebooks
    one after another (about a third of the suite's time) while the other runs other files;
    two notebooks at once on two cores would slow both past what their cells allow, and a
    third worker slows the notebooks' file, the longest, as much as it shares the rest.
    Whole files also keep the tests that bind the DDP tutorial's fixed port (12355) one
    after another."""
    for item in items:
        if is_slow(item.nodeid):
            item.add_marker(pytest.mark.slow)


def pytest_addoption(parser):
    parser.addoption("--stress-runs", type=int, default=None,
                     help="runs of tests/launch/test_interrupts_stress.py (default: "
                          "$DDP_LAB_STRESS_RUNS, else 1000 with DDP_LAB_SOAK=1, else 100)")


@pytest.fixture(scope="session")
def warm_fork_server():
    """Start the fork server once, here, before the tests that use it (the exercise tests
    run one after another on that server): it imports torch and torch._dynamo, which DDP's
    constructor uses, before its first run (launch/forkserver/server.py)."""
    ddp_lab.run(_nothing, 1, echo=False)


def _nothing():
    return None


def run_folders() -> set[str]:
    """Run folders of launches made by this test process (others may be running too)."""
    return set(glob.glob(os.path.join(tempfile.gettempdir(), f"ddp_lab-{os.getpid()}-*")))


def all_run_folders() -> set[str]:
    return set(glob.glob(os.path.join(tempfile.gettempdir(), "ddp_lab-*-*")))


def abandoned_run_folders() -> set[str]:
    """Folders named like a run folder (``ddp_lab-PID-*``) whose process is gone, so nobody
    will remove them: a notebook kernel's or a script's, not only this test process's."""
    found = set()
    for path in all_run_folders():
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


def tasks_created() -> int:
    """Tasks (processes and threads) the kernel has created since boot: a count that only
    grows, read from /proc/stat's ``processes`` line (man 5 proc)."""
    with open("/proc/stat") as stat:
        for line in stat:
            if line.startswith("processes "):
                return int(line.split()[1])
    raise RuntimeError("/proc/stat has no 'processes' line")


@dataclass
class ProcessGate:
    """The state of the machine when the last clean process check began: if nothing was
    created since, and the launcher keeps the same fork servers, the check would find the
    same processes, so none left."""
    seen: tuple = ()
    checked: int = 0
    skipped: int = 0

    @staticmethod
    def state() -> tuple:
        return tasks_created(), frozenset(launcher_pids())


GATE = pytest.StashKey[ProcessGate]()
# How long a test's processes may take to exit after it; tests/test_leak_check.py shortens it
# for its inner run, whose leaks never exit.
GRACE_S = float(os.environ.get("DDP_LAB_LEAK_GRACE_S", "10"))


def pytest_sessionstart(session):
    session.config.stash[GATE] = ProcessGate()


def pytest_terminal_summary(terminalreporter, config):
    gate = config.stash.get(GATE, None)
    if gate is not None and gate.checked + gate.skipped:
        terminalreporter.write_line(
            f"leak check: processes checked after {gate.checked} tests, skipped after "
            f"{gate.skipped} (no task created on this machine since a clean check)")


def assert_no_process_left(gate: ProcessGate) -> None:
    if gate.state() == gate.seen:
        gate.skipped += 1
        return
    gate.checked += 1
    deadline = time.monotonic() + GRACE_S
    while True:
        seen = gate.state()  # before the walk: a process started during it moves the count
        left = leftover_processes() + strays()
        if not left or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    assert not left, f"processes left behind: {[(p.pid, p.cmdline()) for p in left]}"
    gate.seen = seen


class MachineLock:
    """A readers-writer lock between the xdist workers (and any other pytest of this suite on
    the machine): every test holds it shared; a test marked ``alone`` holds it exclusively.
    The turnstile makes it fair: an ``alone`` test waiting for the exclusive lock holds the
    turnstile, so the other worker cannot start test after test ahead of it (flock alone
    would let shared holders starve it). A pytest that a test runs inside its own (the leak
    check's proof) is told ``DDP_LAB_TEST_LOCK=off``: its test holds the lock already."""

    def __init__(self):
        self.off = os.environ.get("DDP_LAB_TEST_LOCK") == "off"
        base = os.path.join(tempfile.gettempdir(), f"ddp-lab-tests-{os.getuid()}")
        self.turnstile = open(base + ".turnstile", "a")
        self.room = open(base + ".lock", "a")

    def enter(self, alone: bool) -> None:
        if self.off:
            return
        fcntl.flock(self.turnstile, fcntl.LOCK_EX)
        fcntl.flock(self.room, fcntl.LOCK_EX if alone else fcntl.LOCK_SH)
        if not alone:
            fcntl.flock(self.turnstile, fcntl.LOCK_UN)

    def leave(self) -> None:
        if self.off:
            return
        fcntl.flock(self.room, fcntl.LOCK_UN)
        fcntl.flock(self.turnstile, fcntl.LOCK_UN)  # held only by an ``alone`` test


MACHINE = pytest.StashKey[MachineLock]()


def settled(read, before: set[str]) -> set[str]:
    """What ``read()`` finds beyond ``before`` after waiting up to the grace period for it to
    go: a launcher of another worker may be removing its folder right now; a real leftover
    stays and fails the test."""
    deadline = time.monotonic() + GRACE_S
    while (new := read() - before) and time.monotonic() < deadline:
        time.sleep(0.2)
    return new


@pytest.fixture(autouse=True)
def nothing_left_behind(request, pytestconfig):
    lock = pytestconfig.stash.setdefault(MACHINE, MachineLock())
    lock.enter(alone=request.node.get_closest_marker("alone") is not None)
    try:
        yield from _checked(pytestconfig)
    finally:
        lock.leave()


def _checked(pytestconfig):
    folders_before = run_folders()
    # every run folder there before, its process alive or not: a stale one whose number a
    # new process of another test takes, then gives up, is not this test's leftover
    abandoned_before = all_run_folders()
    torch_leftovers_before = torch_temp_leftovers()
    yield
    assert_no_process_left(pytestconfig.stash[GATE])
    listening = [c for c in psutil.Process().net_connections("inet") if c.status == "LISTEN"]
    assert not listening, f"ports left listening: {listening}"
    assert run_folders() <= folders_before, "a ddp_lab run folder was left behind"
    abandoned = settled(abandoned_run_folders, abandoned_before)
    assert not abandoned, f"folders of exited processes left behind: {sorted(abandoned)}"
    new_logs = settled(torch_temp_leftovers, torch_leftovers_before)
    assert not new_logs, f"a torchrun or spawn left {sorted(new_logs)} in the temp folder"
