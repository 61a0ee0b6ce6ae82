"""The ``ddp-lab`` command: one small function registers each subcommand.

Subcommands import their module inside the handler, so ``ddp-lab notebooks`` starts
without importing torch or the launcher.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Callable, Sequence

Registrar = Callable[["argparse._SubParsersAction"], None]


# --- notebooks -----------------------------------------------------------------------

def _add_notebooks(sub) -> None:
    p = sub.add_parser(
        "notebooks", help="execute the course notebooks headless in a real kernel",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
        description="Execute the course's notebooks in order, each in a fresh Jupyter "
                    "kernel, as CI and `make course` do. Shows which notebook and cell runs "
                    "(in place on a terminal, a line now and then in a log), then writes "
                    "BUILD/index.html: a card per notebook with what it teaches, its run "
                    "time and your exercises, and keeps your progress in "
                    "BUILD/progress.json (see `ddp-lab progress`). Exits 1 if a notebook "
                    "fails.")
    p.add_argument("--dir", default="notebooks", type=Path, help="folder with the notebooks")
    p.add_argument("--build", default="build", type=Path, help="where executed copies and HTML go")
    p.add_argument("--pattern", default="*.ipynb", help="glob of the notebooks to run")
    p.add_argument("--timeout", default=300.0, type=float, help="seconds allowed per cell")
    p.add_argument("--solved", action="store_true",
                   help="fill every exercise cell with its reference solution; fail if a "
                        "check still says 'not solved yet' (records no progress)")
    p.set_defaults(handler=_cmd_notebooks)


def _summary_table(reports) -> str:
    width = max(len("notebook"), *(len(r.name) for r in reports))
    lines = [f"{'notebook':<{width}}  status  seconds"]
    for r in reports:
        lines.append(f"{r.name:<{width}}  {'ok' if r.ok else 'FAILED':<6}  {r.seconds:7.1f}")
    return "\n".join(lines)


def _cmd_notebooks(args: argparse.Namespace) -> int:
    from ddp_lab.tools import notebook_runner

    if not notebook_runner.find_notebooks(args.dir, args.pattern):
        print(f"ddp-lab notebooks: no notebooks match {args.pattern!r} in {args.dir}/; "
              "pass --dir (and --pattern) to point at the course folder", file=sys.stderr)
        return 2
    from ddp_lab.tools.progress_live import LiveProgress

    with LiveProgress(sys.stdout) as live:
        reports = notebook_runner.run_all(args.dir, args.build, args.pattern, progress=live,
                                          timeout_per_cell=args.timeout, solved=args.solved)
    print("\n" + _summary_table(reports))
    print(f"\nreport: {(args.build / 'index.html').resolve()}", flush=True)
    failed = [r for r in reports if not r.ok]
    if failed:
        print(f"\n{len(failed)} of {len(reports)} notebooks failed:", file=sys.stderr)
    for r in failed:
        print(f"  {r.describe()}", file=sys.stderr)
    return 1 if failed else 0


# --- progress ------------------------------------------------------------------------

def _add_progress(sub) -> None:
    p = sub.add_parser(
        "progress", help="which exercises you solved, and when, over your runs",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
        description="Print your progress through the course's exercises, as the runs of "
                    "`ddp-lab notebooks` (and `make course`) recorded it in "
                    "BUILD/progress.json: each exercise's latest check, when you first "
                    "solved it, and what the check said about the ones not solved yet.")
    p.add_argument("--build", default="build", type=Path,
                   help="the build folder that `ddp-lab notebooks` wrote")
    p.set_defaults(handler=_cmd_progress)


def _cmd_progress(args: argparse.Namespace) -> int:
    import ddp_lab.exercises as ex
    from ddp_lab.tools import progress

    store = args.build / progress.STORE_NAME
    kept = progress.load(args.build)
    if not kept:
        print(f"ddp-lab progress: no progress recorded in {store} yet; run `make course` or "
              "`ddp-lab notebooks` first (and pass the same --build if you gave it one)",
              file=sys.stderr)
        return 1
    print(progress.table(kept, ex.names()))
    feedback = progress.feedback_lines(kept, ex.names())
    if feedback:
        print(f"\nWhat the latest checks said:\n{feedback}")
    return 0


# --- doctor ----------------------------------------------------------------------------

def _add_doctor(sub) -> None:
    p = sub.add_parser("doctor", help="check torch, the backends and a real 2-rank run")
    p.set_defaults(handler=_cmd_doctor)


def _cmd_doctor(args: argparse.Namespace) -> int:
    from ddp_lab.tools import doctor
    return doctor.main()


# --- run -------------------------------------------------------------------------------

def _add_run(sub) -> None:
    p = sub.add_parser("run", help="run one of the course's demos on N ranks", add_help=False,
                       formatter_class=argparse.RawDescriptionHelpFormatter,
                       description="Run a course demo on N ranks; --help lists the demos.")
    p.add_argument("-h", "--help", action=_RunHelp, help="show this help and every demo")
    p.add_argument("demo", help="demo name (see the list below)")
    p.add_argument("-n", "--world-size", type=int, default=4, help="number of ranks")
    p.add_argument("--backend", default="auto", help="auto, gloo or nccl")
    p.add_argument("--timeout", type=float, default=None,
                   help="seconds before it is stopped (default 60; 5 for the demos that "
                        "hang on purpose)")
    p.set_defaults(handler=_cmd_run)


class _RunHelp(argparse.Action):
    """``ddp-lab run --help`` lists every demo with one line from its docstring; read only
    when asked, so building the parser for other commands stays cheap."""

    def __init__(self, option_strings, dest, **kwargs):
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, **kwargs)

    def __call__(self, parser, namespace, values, option_string=None):
        from ddp_lab.tools.demos import describe_demos
        parser.epilog = "demos:\n" + describe_demos()
        parser.print_help()
        parser.exit()


def _cmd_run(args: argparse.Namespace) -> int:
    import ddp_lab
    from ddp_lab.tools.demos import HANGS_ON_PURPOSE, default_timeout, load_demo
    timeout = default_timeout(args.demo) if args.timeout is None else args.timeout
    try:
        fn = load_demo(args.demo)
        res = ddp_lab.run(fn, world_size=args.world_size, backend=args.backend,
                          timeout=timeout)
    except (ValueError, TypeError, ddp_lab.DistributedRunError) as exc:
        print(f"ddp-lab run {args.demo}: {exc}", file=sys.stderr)
        if args.demo in HANGS_ON_PURPOSE and isinstance(exc, ddp_lab.WorkerTimeout):
            print(f"(expected: {args.demo!r} hangs on purpose; the stacks above show where "
                  "each rank waits)", file=sys.stderr)
        return 1
    for rank, value in enumerate(res.values):
        print(f"rank {rank} returned: {value!r}")
    print(f"{res.world_size} ranks, backend {res.backend}, {res.seconds:.2f} s")
    return 0


# --- bench -----------------------------------------------------------------------------

def _add_bench(sub) -> None:
    p = sub.add_parser("bench", help="benchmarks, measured as ratios against peers")
    which = p.add_subparsers(dest="bench", metavar="BENCH", required=True)
    launch = which.add_parser("launch", help="torchrun vs mp.spawn vs ddp_lab cold/warm")
    launch.add_argument("-n", "--world-size", type=int, default=4)
    launch.add_argument("--repeats", type=int, default=3, help="runs of each slow launcher")
    launch.add_argument("--warm-repeats", type=int, default=10)
    launch.set_defaults(handler=_cmd_bench_launch)
    allreduce = which.add_parser("allreduce", help="from-scratch all-reduces vs gloo: table + plots")
    allreduce.add_argument("--out", default="build/bench", help="folder for the figures")
    allreduce.add_argument("-n", "--world-sizes", type=int, nargs="+", default=[2, 4])
    allreduce.add_argument("--threads", type=int, default=2,
                           help="threads per rank for the oversubscribed run")
    allreduce.add_argument("--repeats", type=int, default=20,
                           help="back-to-back calls per timed burst (nccl-tests -n)")
    allreduce.add_argument("--sizes", type=int, nargs="+", default=None,
                           help="bytes (default 1 KiB..64 MiB)")
    allreduce.set_defaults(handler=_cmd_bench_allreduce)
    ddp = which.add_parser("ddp", help="weak scaling of a compute-bound DDP step, 1 -> 2 ranks")
    ddp.add_argument("-n", "--world-sizes", type=int, nargs="+", default=[1, 2])
    ddp.add_argument("--batch", type=int, default=64, help="samples per rank per step")
    ddp.add_argument("--steps", type=int, default=20, help="timed steps per run")
    ddp.add_argument("--repeats", type=int, default=5, help="alternating runs per world size")
    ddp.set_defaults(handler=_cmd_bench_ddp)
    from ddp_lab.tools import bench_buckets  # argument definitions only: no torch import
    buckets = which.add_parser("buckets", help="DDP step time against bucket_cap_mb, "
                                               "with the no-overlap baseline")
    bench_buckets.add_arguments(buckets)
    buckets.set_defaults(handler=_cmd_bench_buckets)
    from ddp_lab.tools import bench_network
    shaped = which.add_parser("network", help="shaped links (ddp_lab.Network): configured "
                                              "vs measured bandwidth and latency")
    bench_network.add_arguments(shaped)
    shaped.set_defaults(handler=_cmd_bench_network)
    live = which.add_parser("ranks", help="a call to live ranks (ddp_lab.Ranks) vs "
                                          "ipyparallel's engines vs a warm ddp_lab.run")
    live.add_argument("-n", "--world-size", type=int, default=4)
    live.add_argument("--repeats", type=int, default=200, help="timed calls of each kind")
    live.set_defaults(handler=_cmd_bench_ranks)
    from ddp_lab.tools import bench_ddp_network
    ddp_net = which.add_parser("ddp-network", help="DDP buckets, overlap and hooks on "
                                                   "loopback vs shaped links")
    bench_ddp_network.add_arguments(ddp_net)
    ddp_net.set_defaults(handler=_cmd_bench_ddp_network)


def _cmd_bench_launch(args: argparse.Namespace) -> int:
    from ddp_lab.tools import bench_launch as bench
    times = bench.measure_launches(
        args.world_size, args.repeats, args.warm_repeats,
        progress=lambda name, s: print(f"  {name:<16} {s:7.3f} s", flush=True))
    report = bench.format_report(times)
    print("\n" + report)
    if bench.missed_targets(times):
        print("ddp-lab bench launch: a target was MISSED (see above); on a loaded machine "
              "run it again when it is quiet", file=sys.stderr)
        return 1
    return 0


def _cmd_bench_ranks(args: argparse.Namespace) -> int:
    from ddp_lab.tools import bench_ranks
    return bench_ranks.main(world_size=args.world_size, repeats=args.repeats)


def _cmd_bench_allreduce(args: argparse.Namespace) -> int:
    from ddp_lab.tools import bench_allreduce
    return bench_allreduce.main(out_dir=args.out, world_sizes=tuple(args.world_sizes),
                                threads=args.threads, repeats=args.repeats, sizes=args.sizes)


def _cmd_bench_ddp(args: argparse.Namespace) -> int:
    from ddp_lab.tools import bench_ddp
    return bench_ddp.main(world_sizes=tuple(args.world_sizes), per_rank_batch=args.batch,
                          steps=args.steps, repeats=args.repeats)


def _cmd_bench_buckets(args: argparse.Namespace) -> int:
    from ddp_lab.tools import bench_buckets
    return bench_buckets.main(args)


def _cmd_bench_network(args: argparse.Namespace) -> int:
    from ddp_lab.tools import bench_network
    return bench_network.main(args)


def _cmd_bench_ddp_network(args: argparse.Namespace) -> int:
    from ddp_lab.tools import bench_ddp_network
    return bench_ddp_network.main(args)


REGISTRARS: tuple[Registrar, ...] = (_add_doctor, _add_run, _add_notebooks, _add_progress,
                                     _add_bench)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="ddp-lab",
        description="The ddp-lab course: PyTorch distributed, launched from Jupyter.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for register in REGISTRARS:
        register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``ddp-lab`` and ``python -m ddp_lab``; returns the exit code."""
    args = build_parser().parse_args(argv)
    return args.handler(args)
