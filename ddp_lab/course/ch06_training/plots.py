"""Notebook 06: the digits, each rank's loss curve, and throughput against world size."""

from __future__ import annotations

from matplotlib.figure import Figure

RANK_COLORS = ["#4c72b0", "#dd8452", "#55a868", "#c44e52", "#8172b3", "#937860"]


def digit_samples(dataset, count: int = 16) -> Figure:
    """The first ``count`` images with their labels, as the model sees them."""
    images, labels = dataset.tensors
    fig = Figure(figsize=(count * 0.7, 1.1), layout="constrained")
    for i, ax in enumerate(fig.subplots(1, count)):
        ax.imshow(images[i, 0], cmap="gray_r")
        ax.set_title(str(labels[i].item()), fontsize=9)
        ax.axis("off")
    return fig


def loss_curves(values: list[dict]) -> Figure:
    """Every rank's loss per batch (its own shard) on one axis, epoch ends marked, with
    the epoch mean over all ranks that the log line reports."""
    fig = Figure(figsize=(9, 3.6), layout="constrained")
    ax = fig.subplots()
    per_epoch = len(values[0]["batch_losses"]) / max(len(values[0]["epoch_losses"]), 1)
    for rank, result in enumerate(values):
        ax.plot(result["batch_losses"], lw=1, alpha=0.8,
                color=RANK_COLORS[rank % len(RANK_COLORS)], label=f"rank {rank} (its shard)")
    ends = [per_epoch * (i + 1) - 1 for i in range(len(values[0]["epoch_losses"]))]
    ax.plot(ends, values[0]["epoch_losses"], "ko-", ms=4, label="epoch mean, all ranks")
    ax.set_yscale("log")
    ax.set_xlabel("batch (all epochs)")
    ax.set_ylabel("cross-entropy loss")
    ax.set_title(f"{len(values)} ranks, one model: test accuracy {values[0]['accuracy']:.2f}%")
    ax.legend(fontsize=8)
    return fig


def scaling(runs: dict, cores: int | None = None) -> Figure:
    """Speed-up over 1 rank per world size for each workload (``{label: scaling_table
    rows}``) against the ideal, efficiency on each bar; and the share of each step spent
    synchronizing gradients."""
    fig = Figure(figsize=(10.5, 3.8), layout="constrained")
    speed_ax, share_ax = fig.subplots(1, 2)
    width = 0.8 / len(runs)
    worlds = [r["world_size"] for r in next(iter(runs.values()))]
    speed_ax.plot(range(len(worlds)), worlds, "k--", label="ideal: N x 1 rank")
    for k, (label, rows) in enumerate(runs.items()):
        offsets = [i + (k - (len(runs) - 1) / 2) * width for i in range(len(rows))]
        color = RANK_COLORS[k % len(RANK_COLORS)]
        bars = speed_ax.bar(offsets, [r["speedup"] for r in rows], width, color=color,
                            label=label)
        speed_ax.bar_label(bars, [f"{r['efficiency']:.0%}" for r in rows], fontsize=7)
        share_ax.bar(offsets, [max(r["sync_share"], 0) * 100 for r in rows], width,
                     color=color, label=label)
    for ax in (speed_ax, share_ax):
        ax.set_xticks(range(len(worlds)), [str(n) for n in worlds])
        ax.set_xlabel("ranks" + (f" (this machine: {cores} cores)" if cores else ""))
        ax.legend(fontsize=8)
    speed_ax.set_ylabel("samples/s relative to 1 rank")
    speed_ax.set_title("Weak scaling (fixed batch per rank); labels: efficiency")
    share_ax.set_ylabel("% of step time")
    share_ax.set_title("Gradient sync's share of a step (step - no_sync step)")
    return fig
