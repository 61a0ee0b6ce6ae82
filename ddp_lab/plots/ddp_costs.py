"""What DDP's options cost (notebook 07): bytes and loss with communication hooks, the
all-reduces that ``no_sync`` saves, the memory of the gradient buckets, and the step time
of ``find_unused_parameters`` / ``static_graph``."""

from __future__ import annotations

from matplotlib.figure import Figure

from ddp_lab.plots.timeline import PALETTE


def hook_curves(results: dict) -> Figure:
    """Left: the global batch's loss per step for each hook. Right: bytes each rank
    all-reduced per step once every hook is in its steady state (the last step)."""
    fig = Figure(figsize=(11, 4.2), layout="constrained")
    loss_ax, bytes_ax = fig.subplots(1, 2, width_ratios=(1.5, 1))
    baseline = next(iter(results.values()))["bytes"][-1]
    for k, (name, r) in enumerate(results.items()):
        loss_ax.plot(r["loss"], color=PALETTE[k], label=name, linewidth=1.6,
                     linestyle=("-", "--", "-", ":")[k % 4])
        sent = r["bytes"][-1]
        bytes_ax.barh(k, sent / 1e3, color=PALETTE[k])
        bytes_ax.text(sent / 1e3, k, f" {sent / 1e3:.1f} kB ({baseline / sent:.0f}x less)"
                      if sent < baseline else f" {sent / 1e3:.0f} kB", va="center", fontsize=8)
    loss_ax.set_yscale("log")
    loss_ax.set_xlabel("step")
    loss_ax.set_ylabel("training loss (MSE, global batch)")
    loss_ax.legend(fontsize=8)
    loss_ax.grid(alpha=0.3)
    bytes_ax.set_yticks(range(len(results)), list(results))
    bytes_ax.set_ylim(len(results) - 0.5, -0.5)
    bytes_ax.set_xscale("log")
    bytes_ax.set_xlim(right=baseline / 1e3 * 30)
    bytes_ax.set_xlabel("kB all-reduced per step and rank (log scale)")
    fig.suptitle("Communication hooks: same training, fewer bytes")
    return fig


def accumulation_bars(pair: dict, accumulation: int) -> Figure:
    """All-reduce calls and bytes per optimizer step with and without ``no_sync``."""
    fig = Figure(figsize=(9, 3.0), layout="constrained")
    axes = fig.subplots(1, 2)
    names = list(pair)
    for ax, key, unit in zip(axes, ("all_reduces", "bytes"), ("all-reduces", "kB")):
        values = [pair[n][key][-1] / (1e3 if key == "bytes" else 1) for n in names]
        ax.barh(range(len(names)), values, color=[PALETTE[2], PALETTE[3]])
        for y, v in enumerate(values):
            ax.text(v, y, f" {v:g}", va="center", fontsize=9)
        ax.set_yticks(range(len(names)), names)
        ax.set_xlim(0, max(values) * 1.25)
        ax.set_xlabel(f"{unit} per optimizer step and rank")
    fig.suptitle(f"Accumulating {accumulation} micro-batches per step")
    return fig


def memory_bars(results: list[dict]) -> Figure:
    """Peak and final RSS above the model itself, per setup, against multiples of the
    parameters' size."""
    params = results[0]["params_mib"]
    fig = Figure(figsize=(9, 3.4), layout="constrained")
    ax = fig.subplots()
    for y, r in enumerate(results):
        ax.barh(y - 0.18, r["peak_mib"], height=0.34, color=PALETTE[0],
                label="peak while training" if y == 0 else None)
        ax.barh(y + 0.18, r["after_mib"], height=0.34, color=PALETTE[0], alpha=0.45,
                label="after the steps" if y == 0 else None)
        ax.text(r["peak_mib"], y - 0.18, f" {r['peak_mib']:.0f} MiB", va="center", fontsize=8)
    for k in (1, 2):
        ax.axvline(k * params, color="grey", linestyle="--", linewidth=1)
        ax.text(k * params, len(results) - 0.45, f" {k}x the parameters", fontsize=8,
                color="grey")
    ax.set_yticks(range(len(results)), [r["setup"] for r in results])
    ax.set_ylim(len(results) - 0.4, -0.6)
    ax.set_xlabel(f"MiB of memory above the model's own {params:.0f} MiB (one fresh rank each)")
    ax.legend(fontsize=8, loc="upper right")
    ax.set_title("The gradient buckets are a second copy of the gradients")
    return fig


def option_bars(costs: dict) -> Figure:
    """Median step time per DDP option."""
    fig = Figure(figsize=(7, 2.4), layout="constrained")
    ax = fig.subplots()
    names = list(costs)
    ax.barh(range(len(names)), [costs[n] for n in names], color=PALETTE[4])
    for y, n in enumerate(names):
        ax.text(costs[n], y, f" {costs[n]:.2f} ms", va="center", fontsize=9)
    ax.set_yticks(range(len(names)), names)
    ax.set_ylim(len(names) - 0.5, -0.5)
    ax.set_xlim(0, max(costs.values()) * 1.3)
    ax.set_xlabel("median ms per step (slowest rank)")
    return fig
