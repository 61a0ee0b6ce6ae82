"""Every run's network private to its user: the processes of a run (the fork server and its
ranks, torchrun's agents and their workers) live in a user + network namespace of their own,
with only a loopback interface, so none of their ports exists where another user (or host)
could connect to it.

Why a namespace: torch's TCPStore and gloo have no authentication (PyTorch's SECURITY.md,
"Using distributed features"), and binding to 127.0.0.1 keeps out other machines but not
the other users of this one, who can list the store's keys, swap a rank's gloo address and
relay (read, change) its tensors; torchrun's store even listens on all interfaces and
unpickles what it holds. A port that does not exist in the machine's namespace cannot be
reached at all. Creating the namespace needs no privilege where the kernel allows
unprivileged user namespaces (``unshare(CLONE_NEWUSER | CLONE_NEWNET)``); the creator holds
CAP_NET_ADMIN in its new namespace and brings ``lo`` up itself. The user and group map to
themselves (not to root, as ``unshare --map-root-user`` would), so a rank runs as its user.
https://man7.org/linux/man-pages/man7/user_namespaces.7.html

``DDP_LAB_ISOLATION`` chooses: ``auto`` (the default: private where the system allows it,
else one warning and the machine's loopback), ``strict`` (refuse to run without a private
network), ``off`` (the machine's network: for a rank that must reach another machine or a
service).

Run as a script (``python -I -S isolation.py ...``, stdlib only, nothing of ddp_lab or
torch imported: it starts in milliseconds) it is the command prefix that puts a helper in a
private namespace:

- ``-- CMD ...``: a new private namespace, then ``exec CMD`` (fork server, torchrun agent);
- ``--hold``: a new private namespace kept by this process until its stdin closes; it
  prints ``ready`` once inside;
- ``--join PID -- CMD ...``: the namespaces of PID (a holder), then ``exec CMD``: several
  torchrun agents that must reach each other on one loopback;
- ``--probe``: exit 0 if a private namespace can be made here, else print why and exit 1.
"""

from __future__ import annotations

import ctypes
import fcntl
import functools
import os
import signal
import socket
import struct
import subprocess
import sys
import warnings

MODE_VAR = "DDP_LAB_ISOLATION"
MODES = ("auto", "strict", "off")
CLONE_NEWUSER, CLONE_NEWNET, CLONE_NEWNS = 0x10000000, 0x40000000, 0x20000  # <linux/sched.h>
MS_BIND, MS_REC, MS_PRIVATE = 4096, 16384, 1 << 18  # <sys/mount.h>
HOSTS = "/etc/hosts"
SIOCGIFFLAGS, SIOCSIFFLAGS, IFF_UP = 0x8913, 0x8914, 0x1  # <linux/sockios.h>, <net/if.h>
PROBE_TIMEOUT_S = 20.0
# The settings that refuse unprivileged user namespaces, and the value that refuses them.
REFUSING_SETTINGS = (("kernel.unprivileged_userns_clone", "0"),  # Debian's older kernels
                     ("kernel.apparmor_restrict_unprivileged_userns", "1"),  # Ubuntu 23.10+
                     ("user.max_user_namespaces", "0"))


class IsolationUnavailable(RuntimeError):
    """No private network namespace can be made here; the message says why and what to do."""


class SharedNetworkWarning(UserWarning):
    """Runs fall back to the machine's loopback, which other local users can reach."""


# -- inside the helper (stdlib only) ------------------------------------------------------
def enter_private_network() -> None:
    """Move this (single-threaded) process into a new user + network namespace with ``lo``
    up, keeping its own uid and gid; raise IsolationUnavailable if the system refuses.

    root needs no user namespace to make a network namespace, and one would cost it its
    power over files of other users (their owners are not mapped into it, so root's ranks
    could no longer read them): root's runs get a network (and mount) namespace alone,
    which other users cannot enter either (setns needs CAP_SYS_ADMIN over it)."""
    uid, gid = os.geteuid(), os.getegid()
    if uid == 0:
        _call("unshare", CLONE_NEWNET)
    else:
        _call("unshare", CLONE_NEWUSER | CLONE_NEWNET)
        _write_map("/proc/self/setgroups", "deny")  # required before an unprivileged gid_map
        _write_map("/proc/self/uid_map", f"{uid} {uid} 1")
        _write_map("/proc/self/gid_map", f"{gid} {gid} 1")
    loopback_up()
    name_loopback()


def name_loopback() -> None:
    """Give the namespace a hosts file that names every form of its loopback address, in
    a mount namespace of its own (the machine's file is untouched).

    Why: c10d's store looks up the name of each client that connects and warns into the
    output when the lookup fails ("The hostname of the client socket cannot be
    retrieved"): torchrun's store listens on IPv6's any-address, so a client on 127.0.0.1
    arrives as ::ffff:127.0.0.1, which a usual /etc/hosts does not name, and there is no
    DNS server to ask in a private network. Best effort: without it, only that warning
    comes back. The copy is unlinked once mounted (the mount keeps it)."""
    import tempfile
    libc = ctypes.CDLL(None, use_errno=True)
    try:
        with open(HOSTS, "rb") as hosts:
            text = hosts.read()
    except OSError:
        return  # no hosts file to extend: nothing names the loopback anyway
    if libc.unshare(CLONE_NEWNS) != 0:
        return
    # a bind mount made in a mount namespace of our own stays in it, but only if it is not
    # shared with the parent's (root's new namespace copies the machine's propagation)
    libc.mount(b"none", b"/", None, MS_REC | MS_PRIVATE, None)
    fd, copy = tempfile.mkstemp(prefix="ddp_lab-hosts-")
    try:
        os.write(fd, text + b"\n::1 localhost\n::ffff:127.0.0.1 localhost\n")
        libc.mount(copy.encode(), HOSTS.encode(), None, MS_BIND, None)
    finally:
        os.close(fd)
        os.unlink(copy)


def join_namespaces(pid: int) -> None:
    """Enter the user, network and mount namespaces of ``pid`` (a ``--hold`` process of
    ours: the same user owns them, so this needs no privilege), user namespace first; those
    it shares with us already (root's user namespace, a mount namespace it could not make)
    are left alone. Joining a mount namespace moves the caller to its root folder: the
    working folder is kept."""
    cwd = os.getcwd()
    for kind, flag in (("user", CLONE_NEWUSER), ("net", CLONE_NEWNET), ("mnt", CLONE_NEWNS)):
        theirs = f"/proc/{pid}/ns/{kind}"
        if os.stat(theirs).st_ino == os.stat(f"/proc/self/ns/{kind}").st_ino:
            continue
        fd = os.open(theirs, os.O_RDONLY)
        try:
            _call("setns", fd, flag)
        finally:
            os.close(fd)
    os.chdir(cwd)


def loopback_up() -> None:
    """``ip link set lo up`` without ip: one SIOCSIFFLAGS ioctl (a new namespace's ``lo``
    is down, and 127.0.0.1 unreachable, until then)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        request = struct.pack("16sH14x", b"lo", 0)
        flags = struct.unpack("16sH14x", fcntl.ioctl(sock, SIOCGIFFLAGS, request))[1]
        try:
            fcntl.ioctl(sock, SIOCSIFFLAGS, struct.pack("16sH14x", b"lo", flags | IFF_UP))
        except OSError as exc:
            raise IsolationUnavailable(f"bringing up lo in the new namespace failed: {exc}") \
                from exc


def _call(name: str, *args) -> None:
    function = getattr(ctypes.CDLL(None, use_errno=True), name)
    if function(*args) != 0:
        raise IsolationUnavailable(f"{name}() failed: {os.strerror(ctypes.get_errno())}")


def _write_map(path: str, text: str) -> None:
    try:
        with open(path, "w") as file:
            file.write(text)
    except OSError as exc:
        raise IsolationUnavailable(f"writing {path} failed: {exc.strerror}") from exc


def why_refused(detail: str) -> str:
    """``detail`` with the system setting that refuses user namespaces, when one does."""
    for name, refusing in REFUSING_SETTINGS:
        try:
            with open("/proc/sys/" + name.replace(".", "/")) as file:
                value = file.read().strip()
        except OSError:
            continue
        if value == refusing:
            return f"{detail} (the setting {name} = {value} refuses it)"
    return detail


def main(argv: list[str]) -> int:
    command = argv[argv.index("--") + 1:] if "--" in argv else []
    try:
        if argv[:1] == ["--join"]:
            join_namespaces(int(argv[1]))
        else:
            enter_private_network()
    except (IsolationUnavailable, OSError) as exc:
        print(why_refused(str(exc)), file=sys.stderr, flush=True)
        return 1
    if argv[:1] == ["--hold"]:
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # the stop button is not for it
        print("ready", flush=True)
        while os.read(0, 4096):
            pass
        return 0
    if command:
        os.execvp(command[0], command)
    return 0  # --probe


# -- in the launcher ----------------------------------------------------------------------
def mode(env=None) -> str:
    """``DDP_LAB_ISOLATION`` (``auto`` when unset), checked."""
    value = (env if env is not None else os.environ).get(MODE_VAR, "auto").strip().lower()
    if value not in MODES:
        raise ValueError(f"{MODE_VAR}={value!r} is not one of {', '.join(MODES)}: auto (the "
                         "default) keeps each run in a private network where the system "
                         "allows it, strict refuses to run otherwise, off uses the "
                         "machine's network")
    return value


def helper_command(*options: str) -> list[str]:
    """The command that runs this file as the namespace helper with ``options``."""
    return [sys.executable, "-I", "-S", os.path.abspath(__file__), *options]


@functools.cache
def probe() -> str | None:
    """None if a private namespace can be made here, else why not (one try per process:
    the answer does not change while it runs)."""
    if not sys.platform.startswith("linux"):
        return "network namespaces are a Linux feature"
    try:
        done = subprocess.run(helper_command("--probe"), capture_output=True, text=True,
                              timeout=PROBE_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"the namespace helper did not run: {exc}"
    return None if done.returncode == 0 else (done.stderr.strip() or f"exit {done.returncode}")


def private(wildcard: bool = False) -> bool:
    """Whether a run's processes go into a private namespace: True where they can; False
    with ``off``, or where the system refuses (after one warning); raises with ``strict``.
    ``wildcard``: the processes listen on every interface (torchrun's store, the rank 0 of
    a torch.multiprocessing script), where the machine's network is refused unless ``off``
    says so: anyone who reaches such a store runs code as its owner."""
    chosen = mode()
    if chosen == "off":
        return False
    reason = probe()
    if reason is None:
        return True
    if chosen == "strict":
        raise IsolationUnavailable(
            f"{MODE_VAR}=strict, and no private network can be made here: {reason}. Ask "
            "the administrator to allow unprivileged user namespaces, or unset "
            f"{MODE_VAR} to run on this machine's loopback (where other users of this "
            "machine can reach the run's ports).")
    if wildcard:
        raise IsolationUnavailable(
            f"no private network can be made here ({reason}), and this run would listen on "
            "every interface of this machine: torchrun's rendezvous store (or a "
            "torch.multiprocessing script's rank 0) has no authentication, and torchrun's "
            "agent runs what is written there as code. Allow unprivileged user namespaces, "
            f"or set {MODE_VAR}=off to run it anyway (only where no one you do not trust "
            "can reach this machine).")
    _warn_shared(reason)
    return False


@functools.cache
def _warn_shared(reason: str) -> None:
    """Once per process: the fallback of every later run is the same."""
    warnings.warn(SharedNetworkWarning(
        f"ddp_lab: no private network for this kernel's runs ({reason}); they use this "
        "machine's loopback, where other users of this machine can join them. Fine on a "
        f"laptop of your own; on a shared server, set {MODE_VAR}=strict to refuse "
        "instead."), stacklevel=5)


def prefix(wildcard: bool = False) -> tuple[str, ...]:
    """The command prefix that starts a process in a private namespace of its own, or ()
    (``private``: when, and what it raises)."""
    return (*helper_command(), "--") if private(wildcard) else ()


class PrivateNetwork:
    """One private namespace for several processes that must reach each other on one
    loopback (torchrun agents of a multi-node demo on this machine, a listener and its
    client): nobody else reaches their ports (torchrun's store listens on every interface
    of its namespace, and unpickles what it holds). A ``--hold`` process keeps it until
    ``close``, or until this process dies (the holder's stdin closes); each process joins
    it with ``--join``."""

    def __init__(self):
        self.holder: subprocess.Popen | None = None

    def prefix(self) -> list[str]:
        """The command prefix that puts a process in the namespace ([] with ``off``)."""
        from ddp_lab.launch.interrupts import deferred
        if self.holder is None:
            if not private(wildcard=True):  # torchrun's agents, mostly
                return []
            with deferred():  # a Ctrl-C now would leave a holder nobody closes
                self.holder = subprocess.Popen(helper_command("--hold"),
                                               stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                               stderr=subprocess.PIPE, text=True,
                                               start_new_session=True)
            if self.holder.stdout.readline().strip() != "ready":
                said = self.holder.stderr.read().strip()
                self.close()
                raise IsolationUnavailable("a private network could not be made, though "
                                           f"the probe could: {why_refused(said)}")
        return helper_command("--join", str(self.holder.pid), "--")

    def command(self, host, argv: list[str]) -> list[str]:
        """``argv`` as run on ``host`` (a course ``Host``, or agents.ThisMachine): in this
        private network when the host is this machine's network (its ``netns`` is None)."""
        where = self.prefix() if host.netns is None else []
        return [*where, *host.command(argv)]

    def __enter__(self) -> "PrivateNetwork":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        """End the holder (the namespace goes when the last agent inside it is gone)."""
        holder, self.holder = self.holder, None
        if holder is not None:
            holder.stdin.close()
            holder.wait()
            holder.stdout.close()
            holder.stderr.close()


def describe() -> str:
    """One line for ``ddp-lab doctor``: where this machine's runs live."""
    chosen = mode()
    if chosen == "off":
        return f"{MODE_VAR}=off: runs use this machine's network (other users can reach them)"
    reason = probe()
    if reason is None:
        return f"private: each run in a user + network namespace of its own ({MODE_VAR}={chosen})"
    refused = "runs are refused" if chosen == "strict" else \
        "runs fall back to this machine's loopback, which other users can reach"
    return f"not private ({reason}): {refused} ({MODE_VAR}={chosen})"


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
