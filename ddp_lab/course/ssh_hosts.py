"""Two "hosts" running Debian's OpenSSH server, reachable from this machine: the test bed
where ranks on several machines really start through ssh (``via="ssh"``).

Each host is a network namespace (as in ``netns.two_hosts``) with one interface and one
address, running an sshd of its own. The link is a switch: a bridge in a namespace of its
own, with a cable (veth pair) to each host and one to this machine, all on one private /24.
Why a switch rather than a second cable per host: it is the shape of a cluster seen from a
login node. Every host has one interface and one address, which both the machine (ssh, the
controller's connection to each host's agent) and the other host (the ranks' store and
gloo) use, and a cluster's pitfalls bite as there: the hosts share this machine's files,
users and hostname, which resolves to loopback, so gloo needs ``GLOO_SOCKET_IFNAME`` set
to the host's ``interface`` (without it, two ranks started over ssh hang in all_reduce).
The machine gains one interface and one route, to a /24 no route of it covers yet; and
deleting the switch's namespace removes the bridge and every cable at once.

``ssh_hosts()`` needs root, iproute2 and OpenSSH's server and client (``ssh_support()``
says which is missing); it says so before it creates anything.
"""

from __future__ import annotations

import glob
import ipaddress
import os
import pwd
import random
import secrets
import shlex
import shutil
import subprocess
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from ddp_lab.course import netns, ssh_files
from ddp_lab.course.netns import NAME_PREFIX, Host
from ddp_lab.launch.interrupts import deferred

SUBNETS = ipaddress.ip_network("10.214.0.0/16")  # the /24 of a bed is picked in here
MACHINE_SEAT = 254     # the machine's address on the link: .254; host i's: .(i + 1)
FOLDERS = Path("/run")  # root's only (0755): sshd's StrictModes accepts keys below it
FOLDER_PREFIX = "ddp_lab-ssh-"
SWITCH_SUFFIX = "-switch"
START_TIMEOUT_S = 10.0
MAX_HOSTS = 9  # one digit ends each interface's name (Linux allows 15 characters)


@dataclass(frozen=True)
class SshHosts:
    """A running test bed: what a launcher needs to reach the hosts through ssh."""

    hosts: tuple[Host, ...]  # name (as ssh and the hosts' /etc/hosts know it), address, ...
    machine: str             # this machine's address on the link: where hosts reach back
    subnet: str              # the link's /24
    folder: Path             # private (0700): keys, configurations, each sshd's log
    switch: str              # the namespace of the bridge
    cable: str               # the machine's end of its cable to the switch

    @property
    def config(self) -> Path:
        """The ssh_config that ``ssh -F`` reads: host names, keys, known hosts."""
        return self.folder / ssh_files.SSH_CONFIG

    def host(self, host: Host | str) -> Host:
        """The bed's host of that name (or that host itself)."""
        name = getattr(host, "name", host)
        found = [candidate for candidate in self.hosts if candidate.name == name]
        if not found:
            raise KeyError(f"no host {name!r} here: {[h.name for h in self.hosts]}")
        return found[0]

    @property
    def options(self) -> list[str]:
        """What ``ssh`` needs to reach the hosts by name (``ssh *options NAME CMD``), for a
        launcher that builds its own ssh command lines."""
        return ["-F", str(self.config)]

    @property
    def via(self) -> str:
        """The bed as a ``via=`` command template (``{host}``, ``{command}``), for a
        launcher that takes the user's own way to reach a host."""
        return f"ssh -F {shlex.quote(str(self.config))} {{host}} {{command}}"

    def prefix(self, host: Host | str) -> list[str]:
        """``ssh`` to ``host`` as argv: append the remote command as one string."""
        return ["ssh", *self.options, self.host(host).name]

    def command(self, host: Host | str, argv: Sequence[str]) -> list[str]:
        """``argv`` run on ``host`` through ssh (which hands the remote shell one string:
        quoted here, so each argument arrives as it was)."""
        return [*self.prefix(host), "--", shlex.join(argv)]

    def log(self, host: Host | str) -> str:
        """What the host's sshd logged (its start, each login, each refusal)."""
        path = ssh_files.sshd_log(self.folder, self.host(host))
        return path.read_text(errors="replace") if path.exists() else ""

    @property
    def namespaces(self) -> list[str]:
        return [*(host.netns for host in self.hosts), self.switch]


def ssh_support() -> str | None:
    """None if ``ssh_hosts()`` can work here, else why not (in words, with the fix)."""
    reason = netns.namespace_support()
    if reason:
        return reason
    if not ssh_files.SSHD.exists():
        return f"OpenSSH's server {ssh_files.SSHD} is missing (apt-get install openssh-server)"
    for tool in ("ssh", "ssh-keygen"):
        if shutil.which(tool) is None:
            return f"OpenSSH's `{tool}` is missing (apt-get install openssh-client)"
    return None


@contextmanager
def ssh_hosts(count: int = 2) -> Iterator[SshHosts]:
    """Start ``count`` hosts with an sshd each, joined to this machine by a switch;
    always remove everything on the way out (every process on the hosts, the namespaces,
    the cables, the folder), whatever happened in between, Ctrl-C included."""
    if not isinstance(count, int) or not 1 <= count <= MAX_HOSTS:
        raise ValueError(f"count={count!r}: ssh_hosts starts 1 to {MAX_HOSTS} hosts")
    reason = ssh_support()
    if reason:
        raise RuntimeError(f"cannot start the ssh hosts: {reason}")
    remove_orphans()
    bed = _plan(count)
    servers: list[subprocess.Popen] = []
    try:
        _create(bed)
        _start_servers(bed, servers)
        yield bed
    finally:
        with deferred():  # a Ctrl-C during the cleanup waits for its end
            destroy(bed, servers)


def _plan(count: int) -> SshHosts:
    # pid: whose they are (remove_orphans); random: several per process; names fit in 15
    pid = os.getpid()
    tag = f"{pid:x}{secrets.token_hex(2)}"
    subnet = _free_subnet()
    hosts = tuple(Host(f"node{i}", str(subnet[i + 1]), _interface(tag, str(i)),
                       f"{NAME_PREFIX}{pid}-{tag}-node{i}") for i in range(count))
    return SshHosts(hosts, str(subnet[MACHINE_SEAT]), str(subnet),
                    FOLDERS / f"{FOLDER_PREFIX}{pid}-{tag}",
                    f"{NAME_PREFIX}{pid}-{tag}{SWITCH_SUFFIX}", _interface(tag, "m"))


def _interface(tag: str, end: str) -> str:
    """A cable's end: ``end`` is a host's number, or m for the machine's end."""
    return f"ds{tag}{end}"


def _free_subnet() -> ipaddress.IPv4Network:
    """A /24 of SUBNETS that overlaps no route or address of this machine's namespace
    (another bed's, or a real network's)."""
    taken = _networks(_ip_batch(None, ["route show", "addr show"]))
    free = [net for net in SUBNETS.subnets(new_prefix=24)
            if not any(net.overlaps(other) for other in taken)]
    if not free:
        raise RuntimeError(f"no free /24 left in {SUBNETS} for the ssh hosts' link")
    return random.choice(free)


def _networks(text: str) -> list[ipaddress.IPv4Network]:
    """Every IPv4 address or network named in ``ip``'s output."""
    found = []
    for word in text.split():
        try:
            found.append(ipaddress.IPv4Network(word, strict=False))
        except ValueError:
            pass  # not an IPv4 address: a keyword, a device name, an IPv6 address
    return found


def _create(bed: SshHosts) -> None:
    """The folder, the namespaces, the switch and its cables, the files; each thing is
    named in ``bed`` before it exists, so ``destroy`` finds whatever was made."""
    bed.folder.mkdir(mode=0o700)
    _ip_batch(None, [f"netns add {name}" for name in bed.namespaces])
    _ip_batch(None, [f"link add {bed.cable} type veth peer name to-machine netns {bed.switch}",
                     f"addr add {bed.machine}/24 dev {bed.cable}", f"link set {bed.cable} up"])
    ports = ["to-machine", *(f"to-{host.name}" for host in bed.hosts)]
    _ip_batch(bed.switch, [
        "link add switch type bridge", "link set switch up",
        *(f"link add to-{host.name} type veth peer name {host.interface} netns {host.netns}"
          for host in bed.hosts),
        *(f"link set {port} master switch up" for port in ports)])
    for host in bed.hosts:
        _ip_batch(host.netns, [f"addr add {host.address}/24 dev {host.interface}",
                               f"link set {host.interface} up", "link set lo up"])
        netns.write_hosts_file(host, bed.hosts)
    ssh_files.write_all(bed.folder, bed.hosts, bed.subnet, pwd.getpwuid(os.geteuid()).pw_name)


def _ip_batch(namespace: str | None, commands: Sequence[str]) -> str:
    """Several ``ip`` commands in one process (``ip -batch``), in ``namespace`` if given;
    returns what they printed."""
    where = ["-n", namespace] if namespace else []
    done = subprocess.run(["ip", *where, "-batch", "-"], input="\n".join(commands) + "\n",
                          capture_output=True, text=True, timeout=30)
    if done.returncode != 0:
        raise RuntimeError(f"ip -batch in {namespace or 'the machine'} failed: "
                           f"{done.stderr.strip()}\ncommands:\n" + "\n".join(commands))
    return done.stdout


def _start_servers(bed: SshHosts, servers: list[subprocess.Popen]) -> None:
    """An sshd per host, in its namespace and a session of its own (a Ctrl-C in the
    terminal that runs the notebook is not for them); returns once all listen."""
    ssh_files.PRIVSEP.mkdir(mode=0o755, exist_ok=True)
    for host in bed.hosts:
        config = ssh_files.sshd_config(bed.folder, host)
        argv = [str(ssh_files.SSHD), "-D", "-e", "-f", str(config)]
        with open(ssh_files.sshd_log(bed.folder, host), "wb") as log, deferred():
            servers.append(subprocess.Popen(host.command(argv), stdin=subprocess.DEVNULL,
                                            stdout=log, stderr=log, start_new_session=True))
    deadline = time.monotonic() + START_TIMEOUT_S
    for host, server in zip(bed.hosts, servers):
        while "Server listening on" not in bed.log(host):
            if server.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"sshd on {host.name} did not start listening within "
                                   f"{START_TIMEOUT_S:g} s; its log:\n{bed.log(host)}")
            time.sleep(0.01)


def destroy(bed: SshHosts, servers: Sequence[subprocess.Popen] = ()) -> None:
    """Kill every process on the hosts (sshd, its sessions, whatever they started, in a
    session of its own or not), delete the namespaces with their cables and the folder.
    Every step runs even if an earlier one failed."""
    netns.remove(bed.namespaces, [bed.cable])
    for server in servers:
        try:
            server.wait(timeout=10)  # killed above: reap it
        except subprocess.TimeoutExpired:
            pass
    shutil.rmtree(bed.folder, ignore_errors=True)


def remove_orphans() -> list[str]:
    """Remove what beds of dead processes left (killed before their cleanup ran): their
    namespaces (and so their sshds and whatever ran on the hosts), the machine's end of
    each cable, and folders."""
    import psutil
    removed = netns.remove_orphans()
    # the kernel frees a deleted namespace, and so the cable into it, a moment later
    netns.remove([], [_interface(name[:-len(SWITCH_SUFFIX)].split("-")[-1], "m")
                      for name in removed if name.endswith(SWITCH_SUFFIX)])
    for folder in glob.glob(str(FOLDERS / f"{FOLDER_PREFIX}*-*")):
        pid = Path(folder).name[len(FOLDER_PREFIX):].split("-")[0]
        if pid.isdigit() and not psutil.pid_exists(int(pid)):
            shutil.rmtree(folder, ignore_errors=True)
            removed.append(folder)
    return removed
