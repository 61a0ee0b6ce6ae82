"""The sandbox's helper, run by sandbox.py as ``python -I -S sandbox_helper.py`` (stdlib
only: it starts in milliseconds and trusts nothing of the environment). It reads its
orders (JSON) from stdin, then:

1. the helper makes a new user, mount, network, PID and IPC namespace, mapping one
   unprivileged user into it (sandbox.py chooses: the caller, or ``nobody`` for root);
2. it forks the namespace's init (PID 1), which builds the file system
   (sandbox_mounts.py), brings ``lo`` up, and forks the command with the budgets as
   rlimits, as the mapped user, with no capability left (``execve`` drops them) and no
   way to gain one (``PR_SET_NO_NEW_PRIVS``);
3. init reaps orphans until the command ends, or until the command's processes reach
   ``max_processes`` (a fork bomb), then exits: the kernel kills every process left in
   the PID namespace, and the mounts and namespaces go with the last of them;
4. init writes one JSON line on the status pipe: the command's wait status, or why the
   sandbox could not be made.

SIGTERM to the helper (the caller's timeout, or the caller's death: PR_SET_PDEATHSIG)
kills init, and with it the whole namespace, before the helper exits.
"""

from __future__ import annotations

import ctypes
import json
import os
import resource
import select
import signal
import sys

sys.path[:0] = [os.path.dirname(os.path.abspath(__file__)),
                os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                             "launch", "network")]
import namespaces  # noqa: E402 - ddp_lab/launch/network/namespaces.py, stdlib only
import sandbox_mounts  # noqa: E402

CLONE_NEWNS, CLONE_NEWIPC, CLONE_NEWUSER = 0x20000, 0x08000000, 0x10000000  # <sched.h>
CLONE_NEWPID, CLONE_NEWNET = 0x20000000, 0x40000000
NAMESPACES = CLONE_NEWUSER | CLONE_NEWNS | CLONE_NEWNET | CLONE_NEWPID | CLONE_NEWIPC
SYS_KEYCTL, KEYCTL_JOIN_SESSION_KEYRING = 250, 1  # x86_64 <asm/unistd_64.h>, <linux/keyctl.h>
PR_SET_PDEATHSIG, PR_SET_DUMPABLE, PR_SET_NO_NEW_PRIVS = 1, 4, 38  # <linux/prctl.h>
WATCH_S = 0.25  # how often init counts the command's processes

_libc = ctypes.CDLL(None, use_errno=True)


def _prctl(option: int, value: int) -> None:
    if _libc.prctl(option, ctypes.c_ulong(value), 0, 0, 0):
        raise OSError(ctypes.get_errno(), f"prctl({option}) failed")


# -- the helper: namespaces and the wait -------------------------------------------------
def enter_namespaces(uid: int, gid: int, paths: list[str]) -> dict[str, int]:
    """Unshare, map ``uid``/``gid`` (to themselves) into the new user namespace, and
    return a descriptor of each of ``paths`` opened in the new mount namespace (a bind
    mount's source must be there) before the change of user (see ``become``). Only
    a process of the parent namespace may map another user than its own: for root, a
    child left behind writes the maps (user_namespaces(7), "Defining user and group
    ID mappings")."""
    if os.geteuid() != 0:
        namespaces.libc_call("unshare", NAMESPACES)
        namespaces.write_map("/proc/self/setgroups", "deny")
        namespaces.write_map("/proc/self/uid_map", f"{uid} {uid} 1")
        namespaces.write_map("/proc/self/gid_map", f"{gid} {gid} 1")
        return {path: _open(path) for path in paths}
    go_read, go_write = os.pipe()
    done_read, done_write = os.pipe()
    me = os.getpid()
    mapper = os.fork()
    if mapper == 0:
        os.close(go_write)
        os.close(done_read)
        said = b""
        if os.read(go_read, 1) == b"u":
            try:
                namespaces.write_map(f"/proc/{me}/uid_map", f"{uid} {uid} 1")
                namespaces.write_map(f"/proc/{me}/gid_map", f"{gid} {gid} 1")
                said = b"ok"
            except namespaces.NamespaceRefused as exc:
                said = str(exc).encode()
        os.write(done_write, said or b"the namespace was not made")
        os._exit(0)
    os.close(go_read)
    os.close(done_write)
    try:
        namespaces.libc_call("unshare", NAMESPACES)
        os.write(go_write, b"u")
    finally:
        os.close(go_write)
        said = os.read(done_read, 4096).decode(errors="replace")
        os.close(done_read)
        os.waitpid(mapper, 0)
    if said != "ok":
        raise namespaces.NamespaceRefused(said)
    kept = {path: _open(path) for path in paths}  # root's folders may be 0700
    become(uid, gid)
    return kept


def _open(path: str) -> int:
    return os.open(path, os.O_RDONLY | os.O_DIRECTORY)


def become(uid: int, gid: int) -> None:
    """Root's helper turns into the mapped user, keeping every capability in the new
    namespace (its root is not mapped, so the kernel's "leaving root drops capabilities"
    rule does not apply): files made in the sandbox's tmpfs mounts need an owner that the
    namespace maps."""
    os.setgroups([])
    os.setresgid(gid, gid, gid)
    os.setresuid(uid, uid, uid)


def helper(orders: dict) -> int:
    """Step 1, then wait for init (step 2 on) and return; a refusal goes to the status
    pipe as ``{"error": ...}``."""
    status, uid, gid = orders["status_fd"], orders["uid"], orders["gid"]
    try:
        orders["kept"] = enter_namespaces(uid, gid, [orders["folder"], *orders["needed"]])
    except (namespaces.NamespaceRefused, OSError) as exc:
        _tell(status, {"error": namespaces.why_refused(str(exc)), "refused": True})
        return 1
    _prctl(PR_SET_PDEATHSIG, signal.SIGTERM)  # after the change of user, which clears it
    if os.getppid() != orders["caller"]:
        return 1  # the caller died before the line above: nobody waits for us
    _prctl(PR_SET_DUMPABLE, 0)  # after the maps: /proc/self/*_map are then root's
    lifeline_read, lifeline_write = os.pipe()
    init = os.fork()
    if init == 0:
        os.close(lifeline_write)
        os._exit(init_main(orders, lifeline_read))
    os.close(lifeline_read)
    os.close(status)
    stop = lambda *_: _kill(init)  # noqa: E731
    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(signum, stop)
    os.waitpid(init, 0)  # returns once the PID namespace is empty
    return 0


def _kill(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def _tell(fd: int, message: dict) -> None:
    os.write(fd, (json.dumps(message) + "\n").encode())


# -- init: PID 1 of the sandbox ----------------------------------------------------------
def init_main(orders: dict, lifeline: int) -> int:
    status = orders["status_fd"]
    try:
        _prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
        os.set_blocking(lifeline, False)
        try:
            if os.read(lifeline, 1) == b"":
                return 1  # the helper died before the line above
        except BlockingIOError:
            pass
        _prctl(PR_SET_DUMPABLE, 0)  # the command cannot ptrace init, nor read its /proc
        kept = orders["kept"]
        sandbox_mounts.build(orders["folder"], kept[orders["folder"]], orders["memory_bytes"],
                             {path: kept[path] for path in orders["needed"]},
                             orders["hidden"])
        namespaces.loopback_up()
        namespaces.name_loopback()
        leave_session_keyring()
    except (OSError, namespaces.NamespaceRefused) as exc:
        _tell(status, {"error": f"the sandbox could not be built: {exc}"})
        return 1
    command = os.fork()
    if command == 0:
        run_command(orders)  # never returns
    _tell(status, supervise(command, orders["max_processes"]))
    return 0


def leave_session_keyring() -> None:
    """A new, empty session keyring: the caller's is inherited, and whoever holds a
    keyring may read the keys in it whatever its uid (keyrings(7), "possession"). Best
    effort: where the syscall is refused (a container's seccomp), there is none to leave
    either."""
    if os.uname().machine == "x86_64":
        _libc.syscall(SYS_KEYCTL, KEYCTL_JOIN_SESSION_KEYRING, None)


def run_command(orders: dict) -> None:
    """In the command's process: set the budgets as rlimits and execute the command in
    its folder (its capabilities go at ``execve``: it is not root in the namespace);
    exit 127 if it cannot be executed."""
    try:
        for signum in (signal.SIGPIPE, signal.SIGXFSZ):  # Python ignores them; commands do not
            signal.signal(signum, signal.SIG_DFL)
        _prctl(PR_SET_NO_NEW_PRIVS, 1)
        set_budgets(orders)
        os.chdir(orders["folder"])
        os.closerange(3, 1 << 16)
        argv = orders["argv"]
        os.execvpe(argv[0], argv, orders["env"])
    except OSError as exc:
        os.write(2, f"sandbox: cannot run {orders['argv'][0]!r}: {exc}\n".encode())
    os._exit(127)


def set_budgets(orders: dict) -> None:
    """Per process: address space (``memory_bytes``), the size of a file; per user in
    this namespace: processes (threads count too: each is a task); no core dumps."""
    memory = orders["memory_bytes"]
    processes = orders["max_processes"] + 2  # the helper and init are the same user's
    for limit, value in ((resource.RLIMIT_AS, memory), (resource.RLIMIT_FSIZE, memory),
                         (resource.RLIMIT_NPROC, processes), (resource.RLIMIT_CORE, 0)):
        resource.setrlimit(limit, (value, value))


def supervise(command: int, max_processes: int) -> dict:
    """Reap every process that ends until ``command`` does; stop early when the
    command's processes number ``max_processes`` (forks are failing: a fork bomb)."""
    watch = os.pidfd_open(command)
    while True:
        ended = _reap(command)
        if ended is not None:
            return {"status": ended, "capped": False}
        if _tasks() >= max_processes:
            return {"status": None, "capped": True}
        select.select([watch], [], [], WATCH_S)


def _reap(command: int) -> int | None:
    """Reap what has ended; the command's wait status if it is among them."""
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return None
        if pid == 0:
            return None
        if pid == command:
            return status


def _tasks() -> int:
    """The tasks (threads included) of this PID namespace but init."""
    count = 0
    for name in os.listdir("/proc"):
        if name.isdigit() and name != "1":
            try:
                count += len(os.listdir(f"/proc/{name}/task"))
            except OSError:
                continue  # ended meanwhile
    return count


def main() -> int:
    orders = json.loads(sys.stdin.read())
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)  # the command's stdin
    os.close(null)
    return helper(orders)


if __name__ == "__main__":
    sys.exit(main())
