"""``ddp-lab bench buckets``: DDP step time against ``bucket_cap_mb``, with the no-overlap
baseline (all-reduce after backward), backward alone and one all-reduce alone.

The measurement is ``ddp_lab.course.ch07_inside_ddp.bucket_sweep.time_buckets`` (notebook 07 runs a
shorter one); this prints its table and, with ``--out``, saves the figure. Torch is only
imported when the bench runs, so building the CLI's parser stays fast.
"""

from __future__ import annotations

import argparse

# 8 layers of 1024 x 1024 (34 MB of gradients), from one bucket per tensor to one in all.
CAPS = (0.001, 0.1, 0.5, 2, 8, None, 25, 100, 1000)
WIDTH, DEPTH, BATCH, ITERATIONS, WARMUP = 1024, 8, 64, 20, 2


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("-n", "--world-size", type=int, default=2, help="number of ranks")
    shown = " ".join("default" if cap is None else f"{cap:g}" for cap in CAPS)
    parser.add_argument("--caps", type=_cap, nargs="+", default=list(CAPS),
                        help=f"bucket_cap_mb values in MB, 'default' for DDP's default "
                             f"(default: {shown})")
    parser.add_argument("--width", type=int, default=WIDTH, help="features per layer")
    parser.add_argument("--depth", type=int, default=DEPTH, help="Linear layers")
    parser.add_argument("--batch", type=int, default=BATCH, help="samples per rank")
    parser.add_argument("--iterations", type=int, default=ITERATIONS,
                        help="timed steps per setting")
    parser.add_argument("--warmup", type=int, default=WARMUP,
                        help="untimed steps per setting before the timed ones")
    parser.add_argument("--out", default=None, help="save the figure to this PNG file")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds for the run")


def _cap(text: str):
    """'default' (or 'none') is DDP's default, which an explicit 25 is not."""
    return None if text.lower() in ("default", "none") else float(text)


def config_from(args: argparse.Namespace):
    from ddp_lab.course.ch07_inside_ddp.bucket_sweep import SweepConfig
    from ddp_lab.course.models import MLPConfig
    model = MLPConfig(inputs=args.width, width=args.width, depth=args.depth, outputs=args.width)
    return SweepConfig(caps=tuple(args.caps), model=model, batch=args.batch,
                       warmup=args.warmup, iterations=args.iterations)


def main(args: argparse.Namespace) -> int:
    import ddp_lab
    from ddp_lab.course.ch07_inside_ddp.bucket_sweep import format_sweep, time_buckets
    config = config_from(args)
    print(f"{args.world_size} ranks, {config.model.depth} x Linear({config.model.width}, "
          f"{config.model.width}), batch {config.batch} per rank, {config.iterations} timed "
          f"steps per setting, {len(config.caps)} bucket sizes ...", flush=True)
    result = ddp_lab.run(time_buckets, world_size=args.world_size, args=(config,),
                         timeout=args.timeout, echo=False)[0]
    print(format_sweep(result))
    if args.out:
        from ddp_lab.course.ch07_inside_ddp.plots import sweep_curve
        sweep_curve(result).savefig(args.out, dpi=110)
        print(f"saved {args.out}")
    return 0
