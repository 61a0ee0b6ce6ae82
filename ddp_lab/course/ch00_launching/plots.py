"""Launch latency: what starting ranks costs with each launcher (notebook 00)."""

from __future__ import annotations

import statistics

from matplotlib.figure import Figure


def launch_latency(times) -> Figure:
    """Median launch + all_reduce time per launcher (bench.LaunchTimes), log scale, with
    every repeat as a dot so the spread is visible."""
    names = list(times.seconds)
    medians = [statistics.median(times.seconds[n]) for n in names]
    fig = Figure(figsize=(7, 3.2), layout="constrained")
    ax = fig.subplots()
    peers = {"torchrun": "#8c8c8c", "mp.spawn script": "#b0b0b0", "ddp_lab cold": "#4c72b0",
             "ddp_lab call 1": "#4c72b0"}
    bars = ax.barh(names, medians, color=[peers.get(n, "#55a868") for n in names])
    for row, name in enumerate(names):
        ax.plot(times.seconds[name], [row] * len(times.seconds[name]), "k.", alpha=0.6)
    ax.bar_label(bars, labels=[f"{m:.2f} s" for m in medians], padding=8)
    ax.set_xscale("log")
    ax.set_xlim(min(medians) / 2, max(medians) * 4)
    ax.invert_yaxis()
    ax.set_xlabel("seconds (log scale): start ranks, all_reduce, collect, clean up")
    ax.set_title(f"Launching a {times.world_size}-rank all_reduce, measured on this machine")
    return fig


def gradients_before_after(before: list, after: list) -> Figure:
    """Each live rank's gradient of one weight row, before and after the hand-written
    all-reduce: different local gradients in, one averaged gradient out (notebook 00b)."""
    fig = Figure(figsize=(9, 3.2), layout="constrained")
    axes = fig.subplots(1, 2, sharey=True)
    width = 0.8 / len(before)
    for ax, grads, title in ((axes[0], before, "after backward (each rank's own batch)"),
                             (axes[1], after, "after all_reduce / world_size")):
        for rank, grad in enumerate(grads):
            xs = [i + rank * width for i in range(len(grad))]
            ax.bar(xs, grad.tolist(), width=width, label=f"rank {rank}")
        ax.set_title(title)
        ax.set_xlabel("weight index")
        ax.axhline(0, color="k", linewidth=0.5)
    axes[0].set_ylabel("gradient")
    axes[1].legend(fontsize=8)
    return fig
