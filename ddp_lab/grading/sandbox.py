"""Run a command the grader does not trust (a learner's notebook, the checks of its
functions) where it can harm nothing: its own user, network, PID, mount and IPC
namespaces; the machine's files read-only but for its ``folder``; the other submissions'
folders hidden (``folder``'s neighbours, and the paths the caller names); a private /tmp,
/dev/shm and /run, terminals of its own; budgets of wall clock, memory, processes and
output; and nothing left behind however it ends, the grader's interruption included
(issue 45: "an isolated, unprivileged environment").

The namespaces are made by sandbox_helper.py (stdlib only, run as ``python -I -S``, like
the launcher's namespaces.py), whose docstring says how. Run as root, the command runs as
``nobody``; run as another user, as that user. Either way it holds no capability and
cannot gain one, and everything it starts lives in its PID namespace, which dies with
it. Nested namespaces still work inside (ddp_lab.run makes its own network namespaces).

What the sandbox does not bound: the memory of all its processes together (each may map
``memory_bytes``, and there are at most ``max_processes``; its /tmp, /dev/shm and /run are
tmpfs mounts of ``memory_bytes`` each; a total would take a cgroup, which needs root or
systemd's delegation), the disk space of files written into ``folder`` (each file is at
most ``memory_bytes``; there is no quota), and CPU time within ``wall_s``. An
unprivileged caller's sandbox runs as that caller, so it can read what the caller can
(root's runs as ``nobody``, and reads only what the world may).
"""

from __future__ import annotations

import json
import os
import pwd
import selectors
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from ddp_lab.grading import sandbox_orders
from ddp_lab.grading.sandbox_output import KeptBytes
from ddp_lab.launch.interrupts import deferred

HELPER = Path(__file__).with_name("sandbox_helper.py")
OUTPUT_BYTES = 1 << 20  # kept of each of stdout and stderr: half from the start, half from the end
STATUS_BYTES = 1 << 16
STOP_GRACE_S = 10.0  # after a stop, how long the helper may take to empty the namespace
MEMORY_SIGNS = ("MemoryError", "Cannot allocate memory", "std::bad_alloc",
                "can't allocate memory", "out of memory")
GIB = 1 << 30
ADVICE = (". The grader runs each submission in user, network, PID and mount namespaces of "
          "its own: where the kernel refuses user namespaces, allow them (sysctl "
          "kernel.unprivileged_userns_clone=1 on older Debian kernels, "
          "kernel.apparmor_restrict_unprivileged_userns=0 on Ubuntu 23.10 and later, "
          "user.max_user_namespaces above 0), or grade in a container that allows them")
NOBODY = 65534  # where the system has no ``nobody`` entry


class SandboxUnavailable(RuntimeError):
    """No sandbox can be made on this machine; the message says why and what to change."""


@dataclass(frozen=True)
class SandboxResult:
    """How the command ended. ``returncode`` is negative for a signal (-9 when it was
    stopped at its wall-clock budget); ``stdout``/``stderr`` keep their first and last
    ``OUTPUT_BYTES / 2`` bytes each, with a line saying what was dropped between them;
    ``reason`` is "" or one line for a grade: why the command was stopped or failed."""

    returncode: int
    stdout: str
    stderr: str
    timed_out: bool
    reason: str


def run_sandboxed(argv: list[str], folder: Path, *, wall_s: float, memory_bytes: int,
                  max_processes: int, env: dict | None = None,
                  hidden: tuple[Path, ...] = ()) -> SandboxResult:
    """Run ``argv`` in ``folder`` (its one writable place, also its working folder),
    killed with every process it started after ``wall_s`` seconds; each process may map
    ``memory_bytes``, and together they may number ``max_processes`` (threads count).
    ``env``: the command's environment (default: PATH, and HOME and TMPDIR in its
    private /tmp). ``hidden``: files and folders it must not see even where the world
    may read them (the class's other submissions, the grades), besides ``folder``'s
    neighbours. Raises SandboxUnavailable where namespaces cannot be made, ValueError
    for a folder or a hidden path the sandbox cannot be built around."""
    orders = sandbox_orders.orders(argv, folder, wall_s, memory_bytes, max_processes, env,
                                   hidden, sandbox_user())
    helper = None
    with deferred():  # a Ctrl-C now would leave a helper nobody stops, or a descriptor
        status_read, status_write = os.pipe()
    try:
        with deferred():
            try:
                helper = _start(orders, status_write)
            finally:
                os.close(status_write)
        outcome = _watch(helper, status_read, time.monotonic() + wall_s)
    finally:
        if helper is not None:
            _stop(helper)
        os.close(status_read)
    return _result(outcome, wall_s, memory_bytes, max_processes)


def sandbox_user() -> tuple[int, int]:
    """The user the command runs as: the caller's own, or, for root, ``nobody`` (root's
    files then belong to no one inside: only what the world may read can be read)."""
    if os.geteuid() != 0:
        return os.geteuid(), os.getegid()
    try:
        entry = pwd.getpwnam("nobody")
        uid, gid = entry.pw_uid, entry.pw_gid
    except KeyError:
        uid, gid = NOBODY, NOBODY
    if not _mapped(uid, "/proc/self/uid_map") or not _mapped(gid, "/proc/self/gid_map"):
        raise SandboxUnavailable(
            f"the grader runs as root of a user namespace that does not map nobody ({uid}), "
            "and root's sandbox runs the command as nobody: run the grader as root of the "
            "machine (or of a container), or as an unprivileged user")
    return uid, gid


def _mapped(number: int, table: str) -> bool:
    """Whether this user namespace maps ``number`` (uid_map's rows: inside, outside, count)."""
    with open(table) as rows:
        return any(int(start) <= number < int(start) + int(count)
                   for start, _, count in (row.split() for row in rows))


def _start(orders: dict, status_write: int) -> subprocess.Popen:
    """The helper, its orders written; the folder given to the sandbox's user first."""
    if os.geteuid() == 0:
        _hand_over(Path(orders["folder"]), orders["uid"], orders["gid"])
    helper = subprocess.Popen([sys.executable, "-I", "-S", str(HELPER)],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, pass_fds=(status_write,),
                              start_new_session=True)
    orders = {**orders, "status_fd": status_write}
    try:
        helper.stdin.write(json.dumps(orders).encode())
        helper.stdin.close()
    except BrokenPipeError:
        pass  # it died at once: its stderr says why
    return helper


def _hand_over(folder: Path, uid: int, gid: int) -> None:
    """Give root's sandbox user the folder (links are changed, never followed)."""
    for root, dirs, files in os.walk(folder):
        for name in [*dirs, *files]:
            os.chown(os.path.join(root, name), uid, gid, follow_symlinks=False)
    os.chown(folder, uid, gid)


def _watch(helper: subprocess.Popen, status_read: int, deadline: float) -> dict:
    """Read the command's output and the status pipe until all are closed (every
    process of the sandbox is gone); at ``deadline``, stop the sandbox."""
    kept = {helper.stdout.fileno(): KeptBytes(OUTPUT_BYTES),
            helper.stderr.fileno(): KeptBytes(OUTPUT_BYTES), status_read: KeptBytes(STATUS_BYTES)}
    timed_out = False
    with selectors.DefaultSelector() as selector:
        for fd in kept:
            selector.register(fd, selectors.EVENT_READ)
        while selector.get_map():
            left = deadline - time.monotonic()
            if left <= 0:
                if timed_out:
                    break  # the helper did not empty the namespace in time: _stop kills it
                timed_out = True
                helper.send_signal(signal.SIGTERM)  # it kills init, and the namespace with it
                deadline = time.monotonic() + STOP_GRACE_S
                continue
            for key, _ in selector.select(left):
                data = os.read(key.fd, 1 << 16)
                if data:
                    kept[key.fd].add(data)
                else:
                    selector.unregister(key.fd)
    return {"stdout": kept[helper.stdout.fileno()].text(),
            "stderr": kept[helper.stderr.fileno()].text(),
            "status": _last_status(kept[status_read].text()), "timed_out": timed_out}


def _last_status(text: str) -> dict:
    lines = [line for line in text.splitlines() if line.startswith("{")]
    return json.loads(lines[-1]) if lines else {}


def _stop(helper: subprocess.Popen) -> None:
    """End the helper if it still runs (SIGTERM: it kills init and waits for the
    namespace to empty; SIGKILL if it does not: init then dies of its parent's death)."""
    if helper.poll() is None:
        helper.send_signal(signal.SIGTERM)
        try:
            helper.wait(STOP_GRACE_S)
        except subprocess.TimeoutExpired:
            helper.kill()
            helper.wait()
    for pipe in (helper.stdin, helper.stdout, helper.stderr):
        pipe.close()


def _result(outcome: dict, wall_s: float, memory_bytes: int,
            max_processes: int) -> SandboxResult:
    status, timed_out = outcome["status"], outcome["timed_out"]
    if "error" in status:
        raise SandboxUnavailable(status["error"] + (ADVICE if status.get("refused") else ""))
    if timed_out or status.get("capped") or status.get("status") is None:
        returncode = -signal.SIGKILL
    else:
        returncode = os.waitstatus_to_exitcode(status["status"])
    if not timed_out and not status:
        raise SandboxUnavailable("the sandbox's helper ended without a word: "
                                 f"{outcome['stderr'].strip()[-2000:]}")
    reason = _reason(returncode, outcome["stderr"], timed_out, status.get("capped", False),
                     wall_s, memory_bytes, max_processes)
    return SandboxResult(returncode, outcome["stdout"], outcome["stderr"], timed_out, reason)


def _reason(returncode: int, stderr: str, timed_out: bool, capped: bool, wall_s: float,
            memory_bytes: int, max_processes: int) -> str:
    """One line for a grade: why the command was stopped, or what ended it."""
    if timed_out:
        return f"ran past its {wall_s:g} s budget"
    if capped:
        return f"tried to start more than {max_processes} processes (threads count)"
    said = stderr[-20000:] if returncode != 0 else ""  # how a Python says it, at its end
    if returncode == -signal.SIGXFSZ or "File too large" in said:
        return f"wrote a file larger than {_size(memory_bytes)}"
    if any(sign in said for sign in MEMORY_SIGNS):
        return f"ran out of memory ({_size(memory_bytes)} per process)"
    if returncode < 0:
        return f"was killed by {signal.Signals(-returncode).name}"
    return ""


def _size(count: int) -> str:
    return f"{count / GIB:g} GiB" if count >= GIB else f"{count / (1 << 20):g} MiB"
