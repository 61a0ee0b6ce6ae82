"""``ddp-lab bench ddp-network``: DDP's bucket size, overlap and compression hooks on
loopback and on shaped links, side by side, with the speedups notebook 07 asserts.

The measurement is ``ddp_lab.course.ch07_inside_ddp.network_costs`` (notebook 07 runs a
shorter one); more steps per setting here give steadier medians on a loaded machine.
Each lesson gets a link of its own: overlap where the all-reduce takes about as long as the
computation, compression where the link dominates (``network_costs.COMM_TO_COMPUTE``).
"""

from __future__ import annotations

import argparse
import sys


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--overlap-network", default=None,
                        help="each rank's link for the bucket and overlap lesson, e.g. "
                             "1gbit (default: the rate at which the all-reduce takes as long "
                             "as the computation measured on loopback)")
    parser.add_argument("--compression-network", default=None,
                        help="each rank's link for the hooks, e.g. 200mbit (default: the rate "
                             "at which the all-reduce takes 3x the computation)")
    parser.add_argument("--batch", type=int, default=512, help="samples per rank per step "
                        "(more computation per step: slower links, less CPU in the network)")
    parser.add_argument("--iterations", type=int, default=15, help="timed steps per setting")
    parser.add_argument("--out", default=None, help="save the figure to this PNG file")


def main(args: argparse.Namespace) -> int:
    from ddp_lab import Network
    from ddp_lab.course.ch07_inside_ddp.network_costs import StepConfig, compare, format_table
    rates = {"overlap": args.overlap_network, "compression": args.compression_network}
    try:
        for rate in filter(None, rates.values()):
            Network(rate)  # a bad rate stops here, before any rank starts
    except ValueError as exc:
        print(f"ddp-lab bench ddp-network: {exc}", file=sys.stderr)
        return 2
    config = StepConfig(batch=args.batch, iterations=args.iterations)
    print(f"2 ranks, {config.model.depth} x Linear({config.model.width}), batch "
          f"{config.batch} per rank, {config.iterations} timed steps per setting, on "
          "loopback and on a link per lesson ...", flush=True)
    results = compare(config, rates, timeout=600.0)
    print(format_table(results))
    if args.out:
        from ddp_lab.course.ch07_inside_ddp.plots import network_bars
        network_bars(results).savefig(args.out, dpi=110)
        print(f"saved {args.out}")
    return 0
