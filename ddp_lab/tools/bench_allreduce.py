"""``ddp-lab bench allreduce``: the from-scratch all-reduces against gloo's built-in.

The full sweep (1 KiB to 64 MiB, 2 and 4 ranks, one OpenMP thread per rank), then the same
benchmark at the target size with oversubscribed threads, to show why one thread per rank
matters when N ranks share few cores. Prints a table and saves the figures.
"""

from __future__ import annotations

import os
from dataclasses import replace

from ddp_lab.course.ch04_allreduce.sweep import MiB, Sweep, SweepConfig, measure_sweep
from ddp_lab.course.units import format_bytes

TARGET_RATIO = 0.8           # the chunked ring must reach this fraction of gloo's speed
TARGET_SIZE, TARGET_WORLD = 16 * MiB, 4


def measure(config: SweepConfig = SweepConfig(), world_sizes=(2, 4), threads: int = 2,
            progress=print) -> tuple[Sweep, Sweep]:
    """The sweep with ``config``, and the oversubscribed one (``threads`` per rank) at the
    target size only, on the largest world size."""
    progress(f"sweep: {len(config.sizes)} sizes, world sizes {world_sizes}, 1 thread per rank")
    one = measure_sweep(replace(config, threads=1), world_sizes)
    sizes = (TARGET_SIZE,) if TARGET_SIZE in config.sizes else config.sizes[-1:]
    progress(f"again with {threads} threads per rank at {format_bytes(sizes[0])}")
    many = measure_sweep(replace(config, sizes=sizes, threads=threads), world_sizes[-1:])
    return one, many


def format_report(one: Sweep, many: Sweep) -> str:
    lines = []
    for world in sorted(one.runs):
        lines += _world_table(one, world) + [""]
    lines += _fit_lines(one) + [""] + _threads_lines(one, many) + [""] + _target_lines(one)
    return "\n".join(lines)


def _world_table(sweep: Sweep, world: int) -> list[str]:
    names = sweep.algorithms(world)
    lines = [f"{world} ranks: ms per call (fastest burst) | busbw (GB/s)",
             f"{'size':>9} " + "".join(f"{n[:16]:>18}" for n in names)]
    for size in sweep.sizes(world):
        cells = "".join(f"{sweep.seconds(world, n, size) * 1e3:>9.3f} |"
                        f"{sweep.busbw(world, n, size) / 1e9:>6.2f} " for n in names)
        lines.append(f"{format_bytes(size):>9} {cells}")
    return lines


def _fit_lines(sweep: Sweep) -> list[str]:
    lines = ["alpha-beta fits, t = alpha + beta * size:",
             f"{'ranks':>5} {'algorithm':<18}{'alpha us':>10}{'1/beta GB/s':>13}"
             f"{'R2 (log t)':>12}{'max rel err':>13}"]
    for world in sorted(sweep.runs):
        for name in sweep.algorithms(world):
            fit = sweep.fit(world, name)
            lines.append(f"{world:>5} {name:<18}{fit.alpha * 1e6:>10.0f}"
                         f"{1 / fit.beta / 1e9:>13.2f}{fit.r2:>12.3f}{fit.max_rel_error:>13.2f}")
    return lines


def _threads_lines(one: Sweep, many: Sweep) -> list[str]:
    world, size = max(many.runs), many.sizes(max(many.runs))[0]
    lines = [f"threads per rank, {world} ranks, {format_bytes(size)} (ms):",
             f"{'algorithm':<18}{'1 thread':>10}{f'{many.threads} threads':>12}{'slowdown':>10}"]
    for name in many.algorithms(world):
        t1, tk = one.seconds(world, name, size), many.seconds(world, name, size)
        lines.append(f"{name:<18}{t1 * 1e3:>10.2f}{tk * 1e3:>12.2f}{tk / t1:>9.2f}x")
    return lines


def _target_lines(sweep: Sweep) -> list[str]:
    if TARGET_WORLD not in sweep.runs or TARGET_SIZE not in sweep.sizes(TARGET_WORLD):
        return ["target not measured (needs 4 ranks and 16 MiB)"]
    ratio = sweep.ratio_to_gloo(TARGET_WORLD, "ring", TARGET_SIZE)
    verdict = "met" if ratio >= TARGET_RATIO else "MISSED"
    return [f"chunked ring vs gloo at {format_bytes(TARGET_SIZE)}, {TARGET_WORLD} ranks: "
            f"{ratio:.2f}x gloo's speed (target >= {TARGET_RATIO:g}x): {verdict}"]


def save_figures(one: Sweep, many: Sweep, out_dir: str) -> list[str]:
    from ddp_lab.course.ch04_allreduce.plots import allreduce_curves, bytes_per_rank, threads_effect
    os.makedirs(out_dir, exist_ok=True)
    world, size = max(many.runs), many.sizes(max(many.runs))[0]
    figures = {"allreduce_curves.png": allreduce_curves(one),
               "allreduce_bytes.png": bytes_per_rank(one, world, size),
               "allreduce_threads.png": threads_effect(one, many, world, size)}
    paths = []
    for name, fig in figures.items():
        paths.append(os.path.join(out_dir, name))
        fig.savefig(paths[-1], dpi=110)
    return paths


def main(out_dir: str = "build/bench", world_sizes=(2, 4), threads: int = 2,
         repeats: int = 20, sizes=None) -> int:
    config = SweepConfig(repeats=repeats, **({"sizes": tuple(sizes)} if sizes else {}))
    one, many = measure(config, tuple(world_sizes), threads)
    print("\n" + format_report(one, many))
    for path in save_figures(one, many, out_dir):
        print(f"saved {path}")
    return 0
