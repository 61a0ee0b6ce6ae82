"""All-reduce from scratch (notebook 04): the ring's chunks step by step, time and bus
bandwidth against size with the fitted alpha-beta model, and bytes sent per rank."""

from __future__ import annotations

from matplotlib.figure import Figure

from ddp_lab.course.ch04_allreduce.allreduce import predicted_bytes
from ddp_lab.course.units import format_bytes
from ddp_lab.course.figures import log_log_axes

COLORS = {"reduce_broadcast": "#c44e52", "whole_ring": "#dd8452", "ring": "#4c72b0",
          "halving_doubling": "#55a868", "gloo": "#333333"}


def ring_steps(traces: list) -> Figure:
    """One row per step, one column per element, one small block per rank: each cell shows
    the value (digits = which ranks it contains, from ``ring_trace``), shaded by how many
    ranks it already sums. Chunk borders are the vertical lines."""
    world, steps = len(traces), len(traces[0])
    numel = traces[0][0][2].numel()
    fig = Figure(figsize=(1.0 + 0.55 * numel * world / 2, 0.42 * world * steps + 1.0),
                 layout="constrained")
    axes = fig.subplots(steps, 1)
    for row, ax in enumerate(axes):
        phase, step = traces[0][row][:2]
        grid = [[_digits_set(int(v)) for v in traces[r][row][2]] for r in range(world)]
        ax.imshow(grid, cmap="Blues", vmin=0, vmax=world * 1.3, aspect="auto")
        for r in range(world):
            for j, v in enumerate(traces[r][row][2].tolist()):
                ax.text(j, r, str(v), ha="center", va="center", fontsize=7)
        for border in range(1, world):
            ax.axvline(border * numel / world - 0.5, color="black", lw=1.2)
        ax.set_yticks(range(world), [f"rank {r}" for r in range(world)], fontsize=7)
        ax.set_xticks([])
        ax.set_ylabel("start" if step < 0 else f"{phase}\nstep {step + 1}", rotation=0,
                      ha="right", va="center", fontsize=8)
    axes[-1].set_xticks(range(numel), [f"chunk {j // (numel // world)}" if j % (numel // world)
                                       == 0 else "" for j in range(numel)], fontsize=7)
    fig.suptitle(f"Chunked ring all-reduce on {world} ranks, every buffer after every step")
    return fig


def _digits_set(value: int) -> int:
    """How many ranks' 10**r are in the value: its decimal 1s (``ring_trace``'s code)."""
    return str(value).count("1")


def allreduce_curves(sweep) -> Figure:
    """Per world size: time against size (dots: the fastest repeat; dashed: the fitted
    alpha + beta * size) and bus bandwidth against size, one colour per algorithm."""
    worlds = sorted(sweep.runs)
    fig = Figure(figsize=(11, 3.9 * len(worlds)), layout="constrained")
    axes = fig.subplots(len(worlds), 2, squeeze=False)
    for (time_ax, bw_ax), world in zip(axes, worlds):
        sizes = sweep.sizes(world)
        for name in sweep.algorithms(world):
            _time_and_model(time_ax, sweep, world, name, sizes)
            bw_ax.plot(sizes, [sweep.busbw(world, name, s) / 1e9 for s in sizes], "o-",
                       ms=3, color=COLORS.get(name), label=name)
        log_log_axes(time_ax, sizes, "time per all-reduce (s, log)",
                 f"{world} ranks: time, with t = α + β·size fitted")
        log_log_axes(bw_ax, sizes, "busbw (GB/s, log)",
                 f"{world} ranks: busbw = size/t · 2(N-1)/N")
        time_ax.legend(loc="upper left", fontsize=6.5)
        if len(sizes) <= 6:  # a reduced sweep: label every size, not every other one
            for ax in (time_ax, bw_ax):
                ax.set_xticks(sizes, [format_bytes(s) for s in sizes], rotation=45, fontsize=8)
    fig.suptitle(f"All-reduce on this machine, {sweep.threads} thread(s) per rank")
    return fig


def _time_and_model(ax, sweep, world: int, name: str, sizes) -> None:
    fit = sweep.fit(world, name)
    color = COLORS.get(name)
    ax.plot(sizes, [sweep.seconds(world, name, s) for s in sizes], "o", ms=4, color=color,
            label=f"{name}: α={fit.alpha * 1e6:.0f} us, 1/β={1 / fit.beta / 1e9:.2f} GB/s, "
                  f"R²={fit.r2:.3f}")
    ax.plot(sizes, [fit.predict(s) for s in sizes], "--", lw=1, color=color)


def bytes_per_rank(sweep, world: int, size: int) -> Figure:
    """Bytes each rank sent for one all-reduce of ``size``: counted in ``Link`` (bars)
    against the algorithm's prediction (black ticks)."""
    names = [a for a in sweep.algorithms(world) if a != "gloo"]
    fig = Figure(figsize=(8, 3.4), layout="constrained")
    ax = fig.subplots()
    width = 0.8 / world
    for i, name in enumerate(names):
        measured = sweep.bytes_sent(world, name, size)
        for r, (got, want) in enumerate(zip(measured, predicted_bytes(name, size, world))):
            x = i + (r - (world - 1) / 2) * width
            ax.bar(x, got / size, width * 0.9, color=COLORS[name], alpha=0.4 + 0.6 * (r == 0))
            ax.plot([x - width / 2, x + width / 2], [want / size] * 2, color="black", lw=2)
    ax.axhline(2 * (world - 1) / world, color="gray", ls=":",
               label=f"2(N-1)/N = {2 * (world - 1) / world:.2f}: the lower bound")
    ax.set_xticks(range(len(names)), names)
    ax.set_ylabel("bytes sent / tensor bytes")
    ax.set_title(f"Bytes each rank sends, {world} ranks, {format_bytes(size)} "
                 "(bars: counted, ranks 0..N-1 left to right; black: predicted)")
    ax.legend(fontsize=8)
    return fig


def threads_effect(one, many, world: int, size: int) -> Figure:
    """Time of each algorithm with one OpenMP thread per rank and with oversubscribed
    threads (``one`` and ``many`` are Sweeps of the same sizes)."""
    names = one.algorithms(world)
    fig = Figure(figsize=(8, 3.2), layout="constrained")
    ax = fig.subplots()
    for i, name in enumerate(names):
        for k, (sweep, shade) in enumerate(((one, 1.0), (many, 0.45))):
            ax.bar(i + (k - 0.5) * 0.4, sweep.seconds(world, name, size) * 1e3, 0.38,
                   color=COLORS.get(name), alpha=shade,
                   label=f"{sweep.threads} thread(s) per rank" if i == 0 else None)
    ax.set_xticks(range(len(names)), names)
    ax.set_ylabel("ms per all-reduce")
    ax.set_title(f"{world} ranks on this machine, {format_bytes(size)}: threads per rank")
    ax.legend(fontsize=8)
    return fig


def link_share_bars(shares: dict, predicted, bandwidth: str) -> Figure:
    """busbw / link rate per algorithm (bars, measured on shaped links) and what the
    busiest link predicts (black ticks), one panel per world size."""
    worlds = sorted(shares)
    fig = Figure(figsize=(10, 3.6), layout="constrained")
    for ax, n in zip(fig.subplots(1, len(worlds), sharey=True, squeeze=False)[0], worlds):
        names = list(shares[n])
        ax.bar(range(len(names)), [shares[n][a] for a in names],
               color=[COLORS.get(a, "#999999") for a in names])
        for i, a in enumerate(names):
            if predicted(a, n) is not None:
                ax.plot([i - 0.4, i + 0.4], [predicted(a, n)] * 2, color="black", lw=2)
        ax.set_xticks(range(len(names)), names, rotation=20, fontsize=8)
        ax.axhline(1.0, color="#999999", ls=":", lw=1)
        ax.set_title(f"{n} ranks, links of {bandwidth}")
    fig.axes[0].set_ylabel("busbw / link rate (black: predicted)")
    return fig
