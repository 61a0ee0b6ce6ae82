"""``ddp-lab bench ...``: the benchmarks, each one measured against its peers on this
machine (ratios, not absolute times, are what they check)."""

from __future__ import annotations

import argparse
import sys

from ddp_lab.tools.cli.formatting import add_command


def add_bench(sub) -> None:
    p = add_command(
        sub, "bench", "benchmarks, measured as ratios against peers",
        "Measure the launcher, the course's all-reduces, DDP and the shaped network on "
        "this machine, each against its peers (torchrun, gloo, loopback). Each takes from "
        "seconds to a few minutes; `ddp-lab bench BENCH --help` lists its options. A "
        "loaded machine skews the figures: run them when it is quiet.")
    which = p.add_subparsers(dest="bench", metavar="BENCH", required=True)
    for add in (_add_launch, _add_allreduce, _add_ddp, _add_buckets, _add_network,
                _add_ranks, _add_ddp_network, _add_grade):
        add(which)


def _add_launch(which) -> None:
    p = add_command(
        which, "launch", "torchrun vs mp.spawn vs ddp_lab cold/warm",
        "Time one all_reduce run launched by torchrun, by an mp.spawn script and by "
        "ddp_lab.run (cold: a fresh process's first call; warm: later calls), and check two "
        "targets: cold at most 0.6x torchrun's time, warm at least 15x faster. Exits 1 "
        "when it prints MISSED, which a busy machine can cause.")
    p.add_argument("-n", "--world-size", type=int, default=4, help="number of ranks")
    p.add_argument("--repeats", type=int, default=3,
                   help="runs of each slow launcher (torchrun, mp.spawn, cold)")
    p.add_argument("--warm-repeats", type=int, default=10, help="warm ddp_lab.run calls")
    p.set_defaults(handler=_cmd_launch)


def _add_allreduce(which) -> None:
    p = add_command(
        which, "allreduce", "from-scratch all-reduces vs gloo: table + plots",
        "Time notebook 04's all-reduces built on send/recv (reduce then broadcast, "
        "whole-tensor ring, chunked ring, halving/doubling) against gloo's all_reduce for "
        "each message size and world size: algbw and busbw in a table, and figures of "
        "time, bytes per rank and threads per rank in the --out folder.")
    p.add_argument("--out", default="build/bench", help="folder for the figures")
    p.add_argument("-n", "--world-sizes", type=int, nargs="+", default=[2, 4],
                   help="world sizes to run")
    p.add_argument("--threads", type=int, default=2,
                   help="threads per rank for the oversubscribed run")
    p.add_argument("--repeats", type=int, default=20,
                   help="back-to-back calls per timed burst (nccl-tests -n)")
    p.add_argument("--sizes", type=int, nargs="+", default=None,
                   help="message sizes in bytes (default: 1 KiB to 64 MiB)")
    p.set_defaults(handler=_cmd_allreduce)


def _add_ddp(which) -> None:
    p = add_command(
        which, "ddp", "weak scaling of a compute-bound DDP step, 1 -> 2 ranks",
        "Weak scaling of a compute-bound DDP training step: the same batch per rank on "
        "each world size, runs of each size alternating; prints samples/s per world size "
        "and ends with the speed-up from the first to the last.")
    p.add_argument("-n", "--world-sizes", type=int, nargs="+", default=[1, 2],
                   help="world sizes to compare")
    p.add_argument("--batch", type=int, default=64, help="samples per rank per step")
    p.add_argument("--steps", type=int, default=20, help="timed steps per run")
    p.add_argument("--repeats", type=int, default=5, help="alternating runs per world size")
    p.set_defaults(handler=_cmd_ddp)


def _add_buckets(which) -> None:
    from ddp_lab.tools import bench_buckets  # argument definitions only: no torch import
    p = add_command(
        which, "buckets", "DDP step time against bucket_cap_mb, with the no-overlap baseline",
        "Time DDP's training step for each bucket_cap_mb, against an all-reduce after "
        "backward (no overlap), on an MLP whose size the options set; --out saves the "
        "figure.")
    bench_buckets.add_arguments(p)
    p.set_defaults(handler=_cmd_buckets)


def _add_network(which) -> None:
    from ddp_lab.tools import bench_network
    p = add_command(
        which, "network", "shaped links (ddp_lab.Network): configured vs measured bandwidth "
                          "and latency",
        "Give two ranks a shaped link (ddp_lab.Network) at each rate and measure what "
        "crosses it: configured against measured bandwidth (TCP between the ranks) and "
        "one-way latency, next to plain loopback. Needs Linux user namespaces, ip and tc; "
        "a latency needs the netem qdisc.")
    bench_network.add_arguments(p)
    p.set_defaults(handler=_cmd_network)


def _add_ranks(which) -> None:
    p = add_command(
        which, "ranks", "a call to live ranks (ddp_lab.Ranks) vs ipyparallel's engines vs a "
                        "warm ddp_lab.run; --hosts: across two ssh hosts",
        "Time one call to live ranks (ddp_lab.Ranks), a trivial one and an all_reduce, "
        "against ipyparallel's engines holding a gloo group and against a warm "
        "ddp_lab.run. Needs `pip install ipyparallel` (its only use in the course)."
        "\n\n"
        "With --hosts: live ranks on two hosts reached through real ssh (the course's ssh "
        "test bed: network namespaces running OpenSSH's server; needs root), --per-host "
        "ranks on each, against as many live ranks on this machine and against "
        "ipyparallel's engines started on the same hosts through the same ssh. Exits 1 "
        "when it prints MISSED, 2 when it cannot run here (it says what to install or do).")
    p.add_argument("-n", "--world-size", type=int, default=4,
                   help="number of ranks (without --hosts)")
    p.add_argument("--repeats", type=int, default=None,
                   help="timed calls of each kind (default: 200; 100 with --hosts)")
    p.add_argument("--hosts", action="store_true",
                   help="across two ssh hosts, against ipyparallel on the same hosts")
    p.add_argument("--per-host", type=int, default=2, help="ranks on each host (--hosts)")
    p.set_defaults(handler=_cmd_ranks)


def _add_ddp_network(which) -> None:
    from ddp_lab.tools import bench_ddp_network
    p = add_command(
        which, "ddp-network", "DDP buckets, overlap and hooks on loopback vs shaped links",
        "Time what DDP's buckets, overlap and compression hooks (fp16, PowerSGD) buy on "
        "loopback and on shaped links, the links chosen from the computation it measures "
        "first unless you name them; --out saves the figure.")
    bench_ddp_network.add_arguments(p)
    p.set_defaults(handler=_cmd_ddp_network)


def _add_grade(which) -> None:
    from ddp_lab.tools import bench_grade
    p = add_command(
        which, "grade", "ddp-lab grade on a class of 20 submissions: seconds per submission",
        "Grade a class of submissions (notebooks 00, 02 and 03, some solved, some not) as "
        "`ddp-lab grade` does, sandboxed, several at a time, and report the wall time, the "
        "seconds per submission and the target: 20 submissions under 10 minutes on 2 "
        "cores. Exits 1 when it is missed or a grade is wrong.")
    bench_grade.add_arguments(p)
    p.set_defaults(handler=_cmd_grade)


def _cmd_grade(args: argparse.Namespace) -> int:
    from ddp_lab.tools import bench_grade
    return bench_grade.main(args)


def _cmd_launch(args: argparse.Namespace) -> int:
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


def _cmd_ranks(args: argparse.Namespace) -> int:
    if args.hosts:
        from ddp_lab.tools import bench_ranks_hosts
        return bench_ranks_hosts.main(per_host=args.per_host,
                                      repeats=100 if args.repeats is None else args.repeats)
    from ddp_lab.tools import bench_ranks
    return bench_ranks.main(world_size=args.world_size,
                            repeats=200 if args.repeats is None else args.repeats)


def _cmd_allreduce(args: argparse.Namespace) -> int:
    from ddp_lab.tools import bench_allreduce
    return bench_allreduce.main(out_dir=args.out, world_sizes=tuple(args.world_sizes),
                                threads=args.threads, repeats=args.repeats, sizes=args.sizes)


def _cmd_ddp(args: argparse.Namespace) -> int:
    from ddp_lab.tools import bench_ddp
    return bench_ddp.main(world_sizes=tuple(args.world_sizes), per_rank_batch=args.batch,
                          steps=args.steps, repeats=args.repeats)


def _cmd_buckets(args: argparse.Namespace) -> int:
    from ddp_lab.tools import bench_buckets
    return bench_buckets.main(args)


def _cmd_network(args: argparse.Namespace) -> int:
    from ddp_lab.tools import bench_network
    return bench_network.main(args)


def _cmd_ddp_network(args: argparse.Namespace) -> int:
    from ddp_lab.tools import bench_ddp_network
    return bench_ddp_network.main(args)
