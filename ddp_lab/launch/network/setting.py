"""``Network``: give a run's ranks a network slower than loopback, one link per rank.

Loopback moves several GB/s, so on one machine the effects that DDP's buckets, overlap and
compression exist for cannot be seen. A shaped run puts every rank in a network namespace
of its own, with one veth link to a bridge (a switch): like N machines, each with one NIC,
plugged into a non-blocking switch. Both directions of each link are shaped with a token
bucket (tc tbf), so a rank can send and receive at ``bandwidth`` at the same time (full
duplex), and traffic between two ranks crosses the sender's link and the receiver's.

No root is needed: the namespaces live in a user namespace of their own (``unshare --user
--map-root-user --net``), the way rootless containers do it.
https://man7.org/linux/man-pages/man7/user_namespaces.7.html
https://man7.org/linux/man-pages/man8/tc-tbf.8.html

``latency`` adds a one-way delay with the netem qdisc, which some kernels lack; then a
shaped run with latency is refused with a clear error, never run without it.
https://man7.org/linux/man-pages/man8/tc-netem.8.html

Documented switch: ``DDP_LAB_NET_PATH`` is the search path for ``unshare``, ``ip`` and
``tc`` (default: ``$PATH`` then /usr/sbin and /sbin, where iproute2 usually lives).
"""

from __future__ import annotations

import functools
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass, field

from ddp_lab.launch.errors import DistributedRunError

PATH_VAR = "DDP_LAB_NET_PATH"
TOOLS = ("unshare", "ip", "tc")
MIN_BITS, MAX_BITS = 1e6, 100e9  # 1 Mbit/s .. 100 Gbit/s: outside, the CPU is the limit
MAX_LATENCY_S = 1.0
MAX_RANKS = 253  # addresses .1 to .253 of the run's subnet; the bridge is .254
MTU = 9000  # jumbo frames, as in a datacenter; the veth's segmentation offload does the rest
_BIT_UNITS = {"": 1, "bit": 1, "kbit": 1e3, "mbit": 1e6, "gbit": 1e9}
_TIME_UNITS = {"": 1.0, "s": 1.0, "ms": 1e-3, "us": 1e-6, "ns": 1e-9}


class NetworkUnavailable(DistributedRunError):
    """This machine cannot give a run a shaped network; the message says why and what to
    do. Raised before any rank starts: a shaped run never silently runs unshaped."""


@dataclass(frozen=True)
class Network:
    """A shaped network for a run: every rank on a link of ``bandwidth`` (``"200mbit"``,
    ``"1gbit"``, ``"10gbit"``, or bits per second), ``latency`` one-way between two ranks
    (``"100us"``, ``"1ms"`` or seconds; needs netem in the kernel), and ``rank_bandwidth``
    ({rank: bandwidth}) for ranks whose link is slower or faster than the rest."""

    bandwidth: str | float = "1gbit"
    latency: str | float | None = None
    rank_bandwidth: dict = field(default_factory=dict)

    def __post_init__(self):
        object.__setattr__(self, "bits_per_s", parse_bandwidth(self.bandwidth))
        object.__setattr__(self, "latency_s", parse_latency(self.latency))
        object.__setattr__(self, "rank_bits", _parse_rank_bandwidth(self.rank_bandwidth))

    def __hash__(self):
        return hash((self.bits_per_s, self.latency_s, tuple(sorted(self.rank_bits.items()))))

    def link_bits(self, rank: int) -> float:
        """Bits per second of ``rank``'s link, each direction."""
        return self.rank_bits.get(rank, self.bits_per_s)


def parse_bandwidth(value, what: str = "bandwidth") -> float:
    """Bits per second from ``"200mbit"``, ``"1gbit"`` or a number (bits/s); units as tc
    spells them (kbit = 1000 bit/s). Bytes per second are left out on purpose: tc's
    "mbps" means megabytes, most people read it as megabits."""
    bits = _parse_quantity(value, _BIT_UNITS, what, "'200mbit', '1gbit', '10gbit' or bits/s")
    if not MIN_BITS <= bits <= MAX_BITS:
        raise ValueError(f"{what}={value!r} is {bits:.3g} bit/s; use 1mbit to 100gbit (below "
                         "that a run takes ages; above it the CPU, not the link, is the limit)")
    return bits


def parse_latency(value) -> float | None:
    if value is None:
        return None
    seconds = _parse_quantity(value, _TIME_UNITS, "latency", "'100us', '1ms' or seconds")
    if not 0 < seconds <= MAX_LATENCY_S:
        raise ValueError(f"latency={value!r} must be more than 0 and at most 1s (or None "
                         "for no added delay)")
    return seconds


def _parse_quantity(value, units: dict, what: str, examples: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        raise TypeError(f"{what} must be a string such as {examples}, got "
                        f"{type(value).__name__}")
    if isinstance(value, str):
        match = re.fullmatch(r"\s*([0-9]*\.?[0-9]+(?:e[+-]?\d+)?)\s*([a-z]*)\s*", value.lower())
        if not match or match.group(2) not in units:
            raise ValueError(f"{what}={value!r} is not understood; write it as {examples}")
        return float(match.group(1)) * units[match.group(2)]
    return float(value)


def _parse_rank_bandwidth(mapping) -> dict[int, float]:
    if not isinstance(mapping, dict):
        raise TypeError("rank_bandwidth must be a dict {rank: bandwidth}, e.g. {1: '200mbit'}")
    bad = [r for r in mapping if isinstance(r, bool) or not isinstance(r, int) or r < 0]
    if bad:
        raise ValueError(f"rank_bandwidth keys must be ranks (ints >= 0), got {bad}")
    return {r: parse_bandwidth(b, f"rank_bandwidth[{r}]") for r, b in mapping.items()}


def check_network(network, world_size: int) -> Network | None:
    """The run's network, or None for plain loopback; a ValueError/TypeError for bad input
    and NetworkUnavailable when this machine cannot shape, before any rank starts."""
    if network is None:
        return None
    if isinstance(network, (str, int, float)) and not isinstance(network, bool):
        network = Network(bandwidth=network)
    if not isinstance(network, Network):
        raise TypeError("network must be ddp_lab.Network(bandwidth='1gbit'), a bandwidth "
                        f"such as '1gbit', or None, got {type(network).__name__}")
    if world_size > MAX_RANKS:
        raise ValueError(f"a shaped network holds at most {MAX_RANKS} ranks (one /24 "
                         f"subnet), got world_size={world_size}")
    too_high = [r for r in network.rank_bits if r >= world_size]
    if too_high:
        raise ValueError(f"rank_bandwidth names ranks {too_high}, but world_size is "
                         f"{world_size} (ranks 0 to {world_size - 1})")
    support = probe(tuple(sorted(find_tools().items())))
    if network.latency_s is not None and not support.netem:
        raise NetworkUnavailable(
            f"latency={network.latency!r} needs the netem qdisc, and this kernel has none "
            f"(tc said: {support.netem_error}). Leave latency=None (bandwidth alone is "
            "shaped), or use a kernel with sch_netem (most desktop distributions ship it: "
            "try `sudo modprobe sch_netem`).")
    return network


def find_tools() -> dict[str, str]:
    """Full paths of unshare, ip and tc, or NetworkUnavailable naming what is missing."""
    if not sys.platform.startswith("linux"):
        raise NetworkUnavailable(
            f"a shaped network needs Linux network namespaces; this is {sys.platform}. Run "
            "with network=None, or in a Linux machine or VM (WSL2 works).")
    search = os.environ.get(PATH_VAR) or os.pathsep.join(
        filter(None, [os.environ.get("PATH"), "/usr/sbin", "/sbin"]))
    found = {name: shutil.which(name, path=search) for name in TOOLS}
    missing = [name for name, path in found.items() if path is None]
    if missing:
        raise NetworkUnavailable(
            f"a shaped network needs {', '.join(missing)}, not found in {search!r}"
            f"{' (from $' + PATH_VAR + ')' if os.environ.get(PATH_VAR) else ''}. Install "
            "util-linux (unshare) and iproute2 (ip, tc), e.g. `sudo apt install util-linux "
            "iproute2`, or run with network=None.")
    return found


@dataclass(frozen=True)
class Support:
    netem: bool
    netem_error: str = ""


PROBE_SCRIPT = """set -e
"$IP" link add probe0 type veth peer name probe1
"$IP" link add probebr type bridge
"$IP" link set probe0 master probebr
"$TC" qdisc add dev probe0 root tbf rate 1mbit burst 32kb latency 50ms
"$TC" qdisc add dev probe1 root netem delay 1ms 2>&1 || true
"""


@functools.cache
def probe(tools_items: tuple) -> Support:
    """Try, once per process and set of tools, everything a shaped run needs in a scratch
    namespace: a user namespace without root, a veth pair, a bridge, tbf; and whether the
    kernel has netem (for ``latency``)."""
    tools = dict(tools_items)
    try:
        done = subprocess.run(
            [tools["unshare"], "--user", "--map-root-user", "--net", "--", "sh", "-c",
             PROBE_SCRIPT], env={**os.environ, "IP": tools["ip"], "TC": tools["tc"]},
            capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise NetworkUnavailable(f"could not try a network namespace ({exc})") from None
    if done.returncode != 0:
        raise NetworkUnavailable(_refusal(done.stderr.strip() or done.stdout.strip()))
    netem_error = done.stdout.strip()
    return Support(netem=not netem_error, netem_error=netem_error)


def _refusal(said: str) -> str:
    if "unshare" in said:
        return (f"this kernel does not let an unprivileged user create a user namespace "
                f"(unshare said: {said}). Allow it (`sysctl user.max_user_namespaces=15000`; "
                "on Ubuntu 24.04+ `sysctl kernel.apparmor_restrict_unprivileged_userns=0`; "
                "Debian before 11: `sysctl kernel.unprivileged_userns_clone=1`), or run with "
                "network=None.")
    return (f"a scratch network namespace could not get a veth link, a bridge or a tbf "
            f"qdisc (said: {said}). The kernel needs veth, bridge and sch_tbf (modules "
            "veth, bridge, sch_tbf); or run with network=None.")


def not_built(error: str) -> NetworkUnavailable:
    return NetworkUnavailable(
        f"the run's network could not be built ({error}); no rank was started. Run with "
        "network=None, or see `ddp-lab bench network` for what works on this machine.")


@dataclass(frozen=True)
class LinkPlan:
    """What the fork server needs to build one run's links (see switch.py)."""

    rank_bits: tuple  # bits/s of each rank's link, in rank order
    latency_s: float | None
    tools: tuple  # (name, path) pairs
    mtu: int = MTU


def link_plan(network: Network, world_size: int) -> LinkPlan:
    return LinkPlan(rank_bits=tuple(network.link_bits(r) for r in range(world_size)),
                    latency_s=network.latency_s, tools=tuple(sorted(find_tools().items())))
