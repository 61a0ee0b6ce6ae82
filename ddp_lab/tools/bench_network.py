"""``ddp-lab bench network``: configured against measured bandwidth (and latency) of the
shaped links ``ddp_lab.Network`` builds, with their ratio, next to plain loopback.

Bandwidth is a TCP stream from rank 1 to rank 0 (ddp_lab.course.links); latency is half the
median round trip of a 1-byte ping-pong, which includes Python's own ~10-20 us per message.
Latency settings need the netem qdisc; where the kernel lacks it they are reported as
refused (with the reason), not measured.
"""

from __future__ import annotations

import argparse
import statistics

BANDWIDTHS = ("100mbit", "200mbit", "1gbit", "2gbit", "5gbit")
SECONDS_OF_TRAFFIC = 0.4
LOOPBACK_BYTES = 200 * 2**20


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--bandwidths", nargs="+", default=list(BANDWIDTHS),
                        help="link rates to try (default: %(default)s)")
    parser.add_argument("--latency", default="1ms",
                        help="one latency to try with the first bandwidth (needs netem)")
    parser.add_argument("--repeats", type=int, default=3, help="transfers per setting (median)")


def measure(network, repeats: int) -> tuple[float, float]:
    """(bits/s, one-way seconds) between two ranks on ``network`` (None: loopback)."""
    import ddp_lab
    from ddp_lab.course.links import tcp_bandwidth, tcp_latency
    nbytes = LOOPBACK_BYTES if network is None else int(
        network.bits_per_s / 8 * SECONDS_OF_TRAFFIC)
    rates = [ddp_lab.run(tcp_bandwidth, 2, args=(nbytes,), network=network, echo=False)[0]
             for _ in range(repeats)]
    latency = ddp_lab.run(tcp_latency, 2, network=network, echo=False)[0]
    return statistics.median(rates), latency


def rows(args: argparse.Namespace) -> list[tuple]:
    """(setting, configured bits/s, measured bits/s, configured s, measured s) per setting."""
    import ddp_lab
    settings = [None] + [ddp_lab.Network(b) for b in args.bandwidths]
    if args.latency:
        settings.append(ddp_lab.Network(args.bandwidths[0], latency=args.latency))
    found = []
    for network in settings:
        name = "loopback (network=None)" if network is None else _name(network)
        try:
            rate, latency = measure(network, args.repeats)
        except ddp_lab.NetworkUnavailable as exc:
            found.append((name, None, None, None, str(exc).split(". ")[0]))
            continue
        found.append((name, network and network.bits_per_s, rate,
                      network and network.latency_s, latency))
    return found


def _name(network) -> str:
    latency = f", latency={network.latency!r}" if network.latency is not None else ""
    return f"Network({network.bandwidth!r}{latency})"


def format_rows(found: list[tuple]) -> str:
    lines = [f"{'setting':34} {'configured':>11} {'measured':>11} {'ratio':>6}   "
             f"{'latency: set':>12} {'measured':>9}"]
    for name, bits, rate, set_s, latency in found:
        if rate is None:
            lines.append(f"{name:34} refused: {latency}")
            continue
        configured = f"{bits / 1e6:8.0f} Mb" if bits else "        -"
        ratio = f"{rate / bits:6.2f}" if bits else "     -"
        set_text = f"{set_s * 1e6:9.0f} us" if set_s else "           -"
        lines.append(f"{name:34} {configured:>11} {rate / 1e6:8.0f} Mb {ratio}   "
                     f"{set_text:>12} {latency * 1e6:6.0f} us")
    return "\n".join(lines)


def main(args: argparse.Namespace) -> int:
    print("2 ranks, each on its own shaped link (veth + tbf both ways) to a bridge; "
          f"median of {args.repeats} TCP transfers of ~{SECONDS_OF_TRAFFIC} s each ...",
          flush=True)
    print(format_rows(rows(args)))
    return 0
