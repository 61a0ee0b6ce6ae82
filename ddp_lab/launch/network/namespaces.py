"""The namespace helper: run as a script (``python -I -S namespaces.py ...``: stdlib only,
nothing of ddp_lab or torch imported, so it starts in milliseconds), it is the command
prefix that puts a process in a private network (isolation.py says why and when).

- ``-- CMD ...``: a new private namespace, then ``exec CMD`` (fork server, torchrun agent);
- ``--hold``: a new private namespace kept by this process until its stdin closes; it
  prints ``ready`` once inside;
- ``--join PID -- CMD ...``: the namespaces of PID (a holder), then ``exec CMD``: several
  torchrun agents that must reach each other on one loopback;
- ``--probe``: exit 0 if a private namespace can be made here, else print why and exit 1.

Creating the namespaces needs no privilege where the kernel allows unprivileged user
namespaces (``unshare(CLONE_NEWUSER | CLONE_NEWNET)``); the creator holds CAP_NET_ADMIN in
its new namespace and brings ``lo`` up itself. The user and group map to themselves (not to
root, as ``unshare --map-root-user`` would), so a rank runs as its user.
https://man7.org/linux/man-pages/man7/user_namespaces.7.html
"""

from __future__ import annotations

import ctypes
import fcntl
import os
import signal
import socket
import struct
import sys

CLONE_NEWUSER, CLONE_NEWNET, CLONE_NEWNS = 0x10000000, 0x40000000, 0x20000  # <linux/sched.h>
MS_BIND, MS_REC, MS_PRIVATE = 4096, 16384, 1 << 18  # <sys/mount.h>
HOSTS = "/etc/hosts"
SIOCGIFFLAGS, SIOCSIFFLAGS, IFF_UP = 0x8913, 0x8914, 0x1  # <linux/sockios.h>, <net/if.h>
# The settings that refuse unprivileged user namespaces, and the value that refuses them.
REFUSING_SETTINGS = (("kernel.unprivileged_userns_clone", "0"),  # Debian's older kernels
                     ("kernel.apparmor_restrict_unprivileged_userns", "1"),  # Ubuntu 23.10+
                     ("user.max_user_namespaces", "0"))


class NamespaceRefused(RuntimeError):
    """The system refused a step of making the namespace; the message says which."""


def enter_private_network() -> None:
    """Move this (single-threaded) process into a new user + network namespace with ``lo``
    up, keeping its own uid and gid; raise NamespaceRefused if the system refuses.

    root needs no user namespace to make a network namespace, and one would cost it its
    power over files of other users (their owners are not mapped into it, so root's ranks
    could no longer read them): root's runs get a network (and mount) namespace alone,
    which other users cannot enter either (setns needs CAP_SYS_ADMIN over it)."""
    uid, gid = os.geteuid(), os.getegid()
    if uid == 0:
        libc_call("unshare", CLONE_NEWNET)
    else:
        libc_call("unshare", CLONE_NEWUSER | CLONE_NEWNET)
        write_map("/proc/self/setgroups", "deny")  # required before an unprivileged gid_map
        write_map("/proc/self/uid_map", f"{uid} {uid} 1")
        write_map("/proc/self/gid_map", f"{gid} {gid} 1")
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
            libc_call("setns", fd, flag)
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
            raise NamespaceRefused(f"bringing up lo in the new namespace failed: {exc}") \
                from exc


def libc_call(name: str, *args) -> None:
    """libc's ``name(*args)`` (unshare, setns), its failure as NamespaceRefused (the grading
    sandbox uses it too)."""
    function = getattr(ctypes.CDLL(None, use_errno=True), name)
    if function(*args) != 0:
        raise NamespaceRefused(f"{name}() failed: {os.strerror(ctypes.get_errno())}")


def write_map(path: str, text: str) -> None:
    """Write a /proc id map (or setgroups) once, its failure as NamespaceRefused."""
    try:
        with open(path, "w") as file:
            file.write(text)
    except OSError as exc:
        raise NamespaceRefused(f"writing {path} failed: {exc.strerror}") from exc


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
    except (NamespaceRefused, OSError) as exc:
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


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
