"""The one home for signalling, listing and killing trees of processes: a rank and its
helpers (the fork server's reaper), torchrun's agent and workers, what runs in a network
namespace. (A rank's own last resort, when the launcher and the fork server are both gone,
is rank/main.py's: the rank imports nothing of the launcher.)

torchrun starts every worker in a session of its own, so killing the agent's process group
misses them, and once the agent is dead they are orphans nobody can list as its children.
Hence: freeze the root first (SIGSTOP: it cannot start a replacement), list its
descendants, kill them group by group, then kill the root.
"""

from __future__ import annotations

import errno
import os
import signal
import sys
import time

PR_SET_CHILD_SUBREAPER = 36  # <linux/prctl.h>


def kill_tree(root_pid: int) -> list[int]:
    """SIGKILL ``root_pid`` and everything below it, and wait until they are gone; returns
    the pids, ``root_pid`` first. Ctrl-C waits until they are (interrupts.deferred): an
    interrupt between the freeze and the kill left a stopped torchrun agent behind, which
    not even its stdin lifeline can end (seen once, for 2 hours, after an interrupted run)."""
    from ddp_lab.launch.interrupts import deferred
    with deferred():
        tree = freeze_and_list(root_pid)
        kill_all([*tree, root_pid])
    return [root_pid, *tree]


def freeze_and_list(root_pid: int) -> list[int]:
    """SIGSTOP ``root_pid`` (frozen, it cannot fork while we list) and return every process
    below it; the caller kills the root (a stopped process still dies of SIGKILL)."""
    send(root_pid, signal.SIGSTOP)
    return descendants(root_pid)


def put_down(pids: list[int], grace: float) -> None:
    """SIGTERM, up to ``grace`` seconds to exit, then SIGKILL with whatever is below them:
    multiprocessing's resource tracker ignores SIGTERM and, once every holder of its pipe is
    gone, unlinks what a crashed process leaked in /dev/shm; SIGKILL at once would leak it.
    For a process that cleans up after its children the way the fork server does
    (torchrun's agent, torchrun/agent.py)."""
    for pid in pids:
        send(pid, signal.SIGTERM)
        send(pid, signal.SIGCONT)
    for pid in wait_gone(pids, grace):
        kill_tree(pid)


def kill_group(pgid: int) -> None:
    """SIGKILL process group ``pgid``, whose leader may be gone already (a reaped rank)."""
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def become_subreaper() -> bool:
    """Make orphans below this process its children instead of init's (Linux only; False
    elsewhere): a grandchild that moved to a session of its own and whose parent died is
    still ours to find and stop. https://man7.org/linux/man-pages/man2/prctl.2.html"""
    if not sys.platform.startswith("linux"):
        return False
    import ctypes
    libc = ctypes.CDLL(None, use_errno=True)
    return libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0


def children(pid: int) -> list[int]:
    """The direct children of ``pid`` now, zombies included."""
    import psutil
    try:
        return [p.pid for p in psutil.Process(pid).children()]
    except psutil.NoSuchProcess:
        return []


def descendants(pid: int) -> list[int]:
    """Every process below ``pid`` now (children, theirs, ...); [] when it is gone."""
    import psutil
    try:
        return [p.pid for p in psutil.Process(pid).children(recursive=True)]
    except psutil.NoSuchProcess:
        return []


def kill_all(pids: list[int]) -> None:
    """SIGKILL each process and its process group, then wait until they are gone."""
    for pid in pids:
        send(pid, signal.SIGKILL, group=True)
        send(pid, signal.SIGKILL)
    wait_gone(pids)


def send(pid: int, sig: int, group: bool = False) -> None:
    """Send a signal to a process (or its process group), if it still exists. A process
    started without a session of its own shares our group: then only the process gets it,
    never this one."""
    try:
        if group and os.getpgid(pid) != os.getpgrp():
            os.killpg(os.getpgid(pid), sig)
        else:
            os.kill(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def send_to_main_thread(pid: int, sig: int) -> None:
    """Send a signal to the main thread of ``pid`` (Linux ``tgkill``), if it still exists.
    A signal sent to a process is taken by whichever of its threads the kernel picks, and
    that thread runs the handler while the others go on: a faulthandler dump run on a
    helper thread reads the main thread's stack while it moves. Sent to the main thread,
    the handler runs there and its stack stays where it was. Where libc has no ``tgkill``
    (not Linux, glibc before 2.30), the process gets it as ``send`` would send it."""
    import ctypes
    tgkill = getattr(ctypes.CDLL(None, use_errno=True), "tgkill", None)
    if tgkill is None:
        send(pid, sig)
    elif tgkill(pid, pid, sig) != 0:
        failure = ctypes.get_errno()
        if failure not in (errno.ESRCH, errno.EPERM):  # gone or not ours: as send ignores
            raise OSError(failure, os.strerror(failure))


def wait_gone(pids: list[int], seconds: float = 10.0) -> list[int]:
    """Wait until the processes exited (a zombie counts as exited: its parent reaps it,
    and waiting for that here would steal its exit status); returns those still alive."""
    deadline = time.monotonic() + seconds
    alive = list(pids)
    while alive:
        alive = [pid for pid in alive if running(pid)]
        if not alive or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    return alive


def running(pid: int) -> bool:
    """Whether ``pid`` exists and is not a zombie."""
    import psutil
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def stopped(pid: int) -> bool:
    """Whether ``pid`` is stopped (SIGSTOP, a debugger): it will not answer until resumed."""
    import psutil
    try:
        return psutil.Process(pid).status() in (psutil.STATUS_STOPPED, psutil.STATUS_TRACING_STOP)
    except psutil.NoSuchProcess:
        return False
