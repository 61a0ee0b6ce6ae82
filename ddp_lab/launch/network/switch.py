"""The fork server's side of a shaped run (setting.py): a bridge, one namespace and one
shaped veth link per rank, and a bridge where the run's store listens (the fork server's
store host opens it: forkserver/store_host.py).

It runs in a fork server started inside ``unshare --user --map-root-user --net``: that
namespace is the switch. For each rank the server steps its main thread into a fresh
network namespace (``unshare(CLONE_NEWNET)`` acts on the calling thread only), builds the
rank's end of the link there, keeps the namespace alive with an open descriptor and steps
back (``setns``). Forking a rank later from inside that namespace puts the rank there. All
of it happens before the first rank is forked, so a failure is reported before any rank
starts. https://man7.org/linux/man-pages/man2/setns.2.html

Each rank's namespace lives while its descriptor is open or a process is inside, so the
descriptors are closed in every rank (it must not keep another run's namespace alive) and
when the run ends, with the links and the bridge.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import subprocess
from dataclasses import dataclass, field

from ddp_lab.launch.network.namespaces import CLONE_NEWNET
from ddp_lab.launch.network.setting import LinkPlan

QUEUE_LATENCY = "50ms"  # tbf's queue: how long a packet may wait for tokens before a drop
MAX_SLOTS = 256
RANK_LINK = "eth0"  # a rank's one interface, its end of its link: gloo and NCCL use it
TOOL_TIMEOUT_S = 20.0


class SwitchError(RuntimeError):
    """ip or tc refused part of a run's network; the message has what they said."""


@dataclass
class RunNet:
    slot: int
    world_size: int
    ip: str  # the ip tool that built it takes it down
    rank_ns: list = field(default_factory=list)  # descriptors holding each rank's namespace

    @property
    def bridge(self) -> str:
        return f"ddpbr{self.slot}"

    @property
    def address(self) -> str:  # the store's, on the bridge
        return f"10.77.{self.slot}.254"

    def rank_address(self, rank: int) -> str:
        return f"10.77.{self.slot}.{rank + 1}"

    def port_name(self, rank: int) -> str:  # the switch's end of rank's link
        return f"ddp{self.slot}r{rank}"


class Switch:
    def __init__(self):
        self.libc = ctypes.CDLL(None, use_errno=True)
        self.home = os.open("/proc/thread-self/ns/net", os.O_RDONLY)
        self.runs: dict[str, RunNet] = {}

    def up(self, run_dir: str, world_size: int, plan: LinkPlan) -> RunNet:
        """Build the run's network; on any failure take down what was built and raise."""
        used = {net.slot for net in self.runs.values()}
        free = [s for s in range(MAX_SLOTS) if s not in used]
        if not free:
            raise SwitchError(f"{MAX_SLOTS} shaped runs at once is the most one process gets")
        net = self.runs[run_dir] = RunNet(slot=free[0], world_size=world_size,
                                           ip=dict(plan.tools)["ip"])
        try:
            for rank in range(world_size):
                net.rank_ns.append(self._rank_namespace(net, rank, plan))
            self._wire(net, plan)
        except BaseException:
            self.down(run_dir)
            raise
        return net

    def _rank_namespace(self, net: RunNet, rank: int, plan: LinkPlan) -> int:
        tools = dict(plan.tools)
        self._call(self.libc.unshare, CLONE_NEWNET)
        try:
            fd = os.open("/proc/thread-self/ns/net", os.O_RDONLY)
            home = f"/proc/{os.getpid()}/fd/{self.home}"  # ip accepts a namespace by path
            _run(tools["ip"], ["-batch", "-"], [
                "link set lo up",
                f"link add {RANK_LINK} mtu {plan.mtu} type veth peer name {net.port_name(rank)} "
                f"netns {home}",
                f"addr add {net.rank_address(rank)}/24 dev {RANK_LINK}",
                f"link set {RANK_LINK} up"])
            _run(tools["tc"], ["-batch", "-"], qdisc_lines(RANK_LINK, plan, rank))
            return fd
        finally:
            self._call(self.libc.setns, self.home, CLONE_NEWNET)

    def _wire(self, net: RunNet, plan: LinkPlan) -> None:
        tools = dict(plan.tools)
        ports = [net.port_name(r) for r in range(net.world_size)]
        _run(tools["ip"], ["-batch", "-"], [
            "link set lo up",  # without it, even the bridge's own address is unreachable here
            f"link add {net.bridge} type bridge", f"addr add {net.address}/24 dev {net.bridge}",
            *(f"link set {p} mtu {plan.mtu} master {net.bridge} up" for p in ports),
            f"link set {net.bridge} up"])
        _run(tools["tc"], ["-batch", "-"],
             [line for r, p in enumerate(ports) for line in qdisc_lines(p, plan, r)])

    @contextlib.contextmanager
    def inside(self, run_dir: str, rank: int):
        """The calling thread in ``rank``'s namespace (fork a rank there), then back."""
        self._call(self.libc.setns, self.runs[run_dir].rank_ns[rank], CLONE_NEWNET)
        try:
            yield
        finally:
            self._call(self.libc.setns, self.home, CLONE_NEWNET)

    def down(self, run_dir: str) -> None:
        """Remove the run's namespaces' descriptors, links and bridge (deleting one end of
        a veth deletes both)."""
        net = self.runs.pop(run_dir, None)
        if net is None:
            return
        for fd in net.rank_ns:
            os.close(fd)
        subprocess.run([net.ip, "-force", "-batch", "-"], capture_output=True, text=True,
                       timeout=TOOL_TIMEOUT_S, input="".join(
                           f"link del {name}\n" for name in
                           [*(net.port_name(r) for r in range(net.world_size)), net.bridge]))

    def close_in_child(self) -> None:
        """In a freshly forked rank: hold no namespace but its own (it is in it)."""
        for fd in [self.home, *(fd for net in self.runs.values() for fd in net.rank_ns)]:
            with contextlib.suppress(OSError):
                os.close(fd)

    def _call(self, function, *args) -> None:
        if function(*args) != 0:
            errno = ctypes.get_errno()
            raise SwitchError(f"{function.__name__}{args} failed: {os.strerror(errno)}")


def qdisc_lines(device: str, plan: LinkPlan, rank: int) -> list[str]:
    """tc commands that shape ``device``'s egress: tbf at the rank's rate; with latency, a
    netem delay of half of it in front (a packet crosses two links: sender's, receiver's).
    https://man7.org/linux/man-pages/man8/tc-netem.8.html (netem with a tbf child)"""
    bits = plan.rank_bits[rank]
    burst = max(256 * 1024, int(bits / 8 * 0.002))  # >= 2 ms of traffic, >= a GSO packet
    tbf = f"tbf rate {int(bits)}bit burst {burst} latency {QUEUE_LATENCY}"
    if plan.latency_s is None:
        return [f"qdisc add dev {device} root {tbf}"]
    delay_us = max(1, round(plan.latency_s / 2 * 1e6))
    return [f"qdisc add dev {device} root handle 1: netem delay {delay_us}us limit 100000",
            f"qdisc add dev {device} parent 1:1 handle 10: {tbf}"]


def _run(tool: str, args: list[str], lines: list[str]) -> None:
    done = subprocess.run([tool, *args], input="".join(f"{line}\n" for line in lines),
                          capture_output=True, text=True, timeout=TOOL_TIMEOUT_S)
    if done.returncode != 0:
        said = (done.stderr or done.stdout).strip()
        raise SwitchError(f"{os.path.basename(tool)} failed: {said}")
