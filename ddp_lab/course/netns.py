"""Two "machines" on one Linux box: network namespaces joined by a virtual cable.

A network namespace has its own interfaces, addresses, routes and ports. Two of them,
joined by a veth pair (a virtual Ethernet cable) with an address at each end, behave like
two hosts on a private link: a process in one cannot reach the other's loopback, the
rendezvous store and gloo must use the real addresses, and the classic multi-node
pitfalls (a hostname that resolves to loopback, gloo picking the wrong interface) bite for
real. What the namespaces still share with the machine: files, users and the hostname.

``two_hosts()`` needs root and iproute2's ``ip`` (``namespace_support()`` says whether
they are there); ``loopback_hosts()`` is the stand-in without them: two "hosts" that are
both this machine on 127.0.0.1.
"""

from __future__ import annotations

import os
import secrets
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from ddp_lab.launch.forkserver.process_tree import send, wait_gone

SUBNET = "10.213.0"        # a private /24 that only exists inside the namespaces
NETNS_ETC = Path("/etc/netns")  # `ip netns exec NS` mounts /etc/netns/NS/hosts on /etc/hosts
NETNS_RUN = Path("/run/netns")  # where `ip netns add` keeps a handle on each namespace
NAME_PREFIX = "ddp_lab-"


@dataclass(frozen=True)
class Host:
    """One machine of the cluster: a name other hosts can resolve, its address, the
    interface that carries it, and the namespace it lives in (None: this machine)."""

    name: str
    address: str
    interface: str
    netns: str | None = None

    def command(self, argv: Sequence[str]) -> list[str]:
        """``argv`` as run on this host."""
        return ["ip", "netns", "exec", self.netns, *argv] if self.netns else list(argv)


def namespace_support() -> str | None:
    """None if ``two_hosts()`` can work here, else why not (in words)."""
    if not sys.platform.startswith("linux"):
        return "network namespaces are a Linux feature"
    if os.geteuid() != 0:
        return "creating network namespaces needs root (run Jupyter with sudo, or in a container)"
    if shutil.which("ip") is None:
        return "iproute2's `ip` command is missing (apt-get install iproute2)"
    return None


def loopback_hosts() -> tuple[Host, Host]:
    """Two "hosts" that are both this machine: what a laptop without root can do."""
    return Host("localhost", "127.0.0.1", "lo"), Host("localhost", "127.0.0.1", "lo")


@contextmanager
def two_hosts() -> Iterator[tuple[Host, Host]]:
    """Create two namespaces joined by a veth pair; always remove them on the way out
    (processes still running inside are killed first), whatever happened in between."""
    reason = namespace_support()
    if reason:
        raise RuntimeError(f"cannot create network namespaces: {reason}")
    remove_orphans()
    hosts = _plan()
    try:
        _create(hosts)
        yield hosts
    finally:
        destroy(hosts)


def _plan() -> tuple[Host, Host]:
    # pid: whose they are (see remove_orphans); random: several per process; interface
    # names must fit in 15 characters
    tag = f"{os.getpid():x}{secrets.token_hex(2)}"
    return tuple(Host(f"node{i}", f"{SUBNET}.{i + 1}", f"dl{tag}{'ab'[i]}",
                      f"{NAME_PREFIX}{os.getpid()}-{tag}-node{i}") for i in range(2))


def _create(hosts: tuple[Host, Host]) -> None:
    first, second = hosts
    for host in hosts:
        _ip("netns", "add", host.netns)
    _ip("link", "add", first.interface, "type", "veth", "peer", "name", second.interface)
    for host in hosts:
        _ip("link", "set", host.interface, "netns", host.netns)
        _ip("-n", host.netns, "addr", "add", f"{host.address}/24", "dev", host.interface)
        _ip("-n", host.netns, "link", "set", host.interface, "up")
        _ip("-n", host.netns, "link", "set", "lo", "up")
        write_hosts_file(host, hosts)


def write_hosts_file(host: Host, hosts: tuple[Host, ...]) -> None:
    """Inside the namespace, /etc/hosts is the machine's plus a line per node: the
    names resolve everywhere (as DNS would make them), while the shared hostname keeps
    resolving to loopback, as on many real machines (Debian maps it to 127.0.1.1). Each
    node is named under its IPv4-mapped IPv6 address too: c10d's sockets listen on IPv6's
    any-address, see a peer as ``::ffff:10.x.y.z`` and look its name up, and a failed
    lookup prints "The hostname of the client socket cannot be retrieved" into the cell
    (network/namespaces.py says more)."""
    folder = NETNS_ETC / host.netns
    folder.mkdir(parents=True, exist_ok=True)
    machine = Path("/etc/hosts").read_text() if Path("/etc/hosts").exists() else ""
    nodes = "".join(f"{h.address} {h.name}\n::ffff:{h.address} {h.name}\n" for h in hosts)
    (folder / "hosts").write_text(machine.rstrip("\n") + "\n" + nodes)


def destroy(hosts: Sequence[Host]) -> None:
    """Kill what runs inside, delete the namespaces (which deletes the veth pair) and
    their /etc/netns folders. Every step runs even if an earlier one failed."""
    # a veth that never reached its namespace is still on the machine
    remove([host.netns for host in hosts], [host.interface for host in hosts])


def remove(namespaces: Sequence[str], interfaces: Sequence[str] = ()) -> None:
    """Kill what runs in ``namespaces``, delete them (a veth or bridge inside goes with
    its namespace) and their /etc/netns folders, then any of ``interfaces`` still in the
    machine's namespace. Every step runs even if an earlier one failed."""
    for name in namespaces:
        _attempt(kill_processes_in, name)
    for name in namespaces:
        _delete(name)
    for interface in interfaces:
        _attempt(_ip, "link", "delete", interface, check=False)
    _attempt(NETNS_ETC.rmdir)  # only if empty: another cluster may be using it


def _delete(netns: str) -> None:
    """Delete the namespace (and with it its end of the veth) and its /etc/netns folder."""
    _attempt(_ip, "netns", "delete", netns, check=False)
    shutil.rmtree(NETNS_ETC / netns, ignore_errors=True)


def _attempt(step, *args, **kwargs) -> None:
    """Run one cleanup step; its failure must not skip the steps after it."""
    try:
        step(*args, **kwargs)
    except Exception:  # noqa: BLE001 - best effort, the next steps matter more
        pass


def kill_processes_in(netns: str) -> list[int]:
    """SIGKILL every process in the namespace; returns their pids. Scans until two scans
    0.1 s apart find nobody new, to catch a process that is entering right now
    (``ip netns exec`` opens the namespace first and joins it a moment later)."""
    try:
        inode = (NETNS_RUN / netns).stat().st_ino
    except FileNotFoundError:
        return []
    killed: list[int] = []
    quiet, until = 0, time.monotonic() + 5.0
    while quiet < 2 and time.monotonic() < until:
        found = [pid for pid in pids_in(inode) if pid not in killed]
        for pid in found:
            send(pid, signal.SIGKILL)
        killed += found
        quiet = 0 if found else quiet + 1
        time.sleep(0.1)
    wait_gone(killed)
    return killed


def pids_in(inode: int) -> list[int]:
    """Processes whose network namespace is the one with this inode (as ``ip netns pids``)."""
    pids = []
    for entry in os.listdir("/proc"):
        try:
            if entry.isdigit() and os.readlink(f"/proc/{entry}/ns/net") == f"net:[{inode}]":
                pids.append(int(entry))
        except OSError:
            pass  # gone, or a zombie without namespaces
    return pids


def list_namespaces() -> list[str]:
    """Names of the machine's network namespaces (``ip netns list``); none where iproute2's
    ``ip`` is missing: ``two_hosts`` cannot have made any (``namespace_support`` says so)."""
    if shutil.which("ip") is None:
        return []
    out = _ip("netns", "list", check=False)
    return [line.split()[0] for line in out.splitlines() if line.strip()]


def own_namespaces() -> list[str]:
    """The namespaces this process made and has not removed (another run on the same
    machine may hold ddp_lab namespaces of its own at the same time)."""
    return [name for name in list_namespaces() if _creator(name) == os.getpid()]


def remove_orphans() -> list[str]:
    """Remove ddp_lab namespaces whose creating process is gone (it was killed before
    its cleanup could run); returns their names."""
    import psutil
    orphans = [name for name in list_namespaces()
               if (pid := _creator(name)) is not None and not psutil.pid_exists(pid)]
    for name in orphans:
        kill_processes_in(name)
        _delete(name)
    return orphans


def _ip(*args: str, check: bool = True) -> str:
    done = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30)
    if check and done.returncode != 0:
        raise RuntimeError(f"`ip {' '.join(args)}` failed: {done.stderr.strip()}")
    return done.stdout


def _creator(name: str) -> int | None:
    """The pid in a ddp_lab namespace name (``ddp_lab-PID-TAG-nodeN``), else None."""
    pid = name[len(NAME_PREFIX):].split("-")[0] if name.startswith(NAME_PREFIX) else ""
    return int(pid) if pid.isdigit() else None
