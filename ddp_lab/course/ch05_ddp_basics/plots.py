"""Figures for notebook 05 (DDP basics), drawn from what the ranks returned: parameters and
gradients per rank, DDP vs single-process differences, dropout masks under each seeding
policy, DistributedSampler shards, and a stopped-and-resumed training run."""

from __future__ import annotations

import torch
from matplotlib.colors import ListedColormap
from matplotlib.figure import Figure

from ddp_lab.course.ch05_ddp_basics.sampling import coverage
from ddp_lab.course.timeline import PALETTE

FLOAT32_ATOL = 1e-5  # torch.testing.assert_close's absolute tolerance for float32


def anatomy_picture(per_rank: list[dict], columns: int = 24) -> Figure:
    """One row per rank, the first ``columns`` values of the flattened parameters before and
    after ``DDP(...)``, and of the gradient before (local) and after the all_reduce."""
    panels = [("before", "parameters before DDP(model)"),
              ("after", "parameters after DDP(model): rank 0's"),
              ("local_grad", "gradient of each rank's own shard (no_sync)"),
              ("synced_grad", "gradient after backward: the average")]
    fig = Figure(figsize=(10, 1.2 * len(per_rank) + 2.4), layout="constrained")
    axes = fig.subplots(2, 2)
    for row in range(2):
        keys = [key for key, _ in panels[2 * row:2 * row + 2]]
        limit = max(r[k][:columns].abs().max().item() for r in per_rank for k in keys)
        for ax, (key, title) in zip(axes[row], panels[2 * row:2 * row + 2]):
            values = torch.stack([r[key][:columns] for r in per_rank]).numpy()
            image = ax.imshow(values, cmap="RdBu_r", vmin=-limit, vmax=limit, aspect="auto")
            ax.set_title(title, fontsize=10)
            ax.set_yticks(range(len(per_rank)), [f"rank {r}" for r in range(len(per_rank))])
            ax.set_xlabel(f"first {columns} values (net1.weight)")
        fig.colorbar(image, ax=axes[row], shrink=0.9)
    return fig


def equivalence_plot(comparison: dict) -> Figure:
    """Left and middle: per step, the largest |DDP - single process| in the gradients and
    in the weights, per world size. Right: how far training moved every weight, DDP vs
    single process (on the diagonal = the same)."""
    reference = comparison["reference"]
    sizes = {n: r for n, r in comparison["world_sizes"].items() if n > 1}
    fig = Figure(figsize=(12, 3.8), layout="constrained")
    axes = fig.subplots(1, 3)
    for ax, key in zip(axes[:2], ("grads", "weights")):
        for i, (n, result) in enumerate(sizes.items()):
            diffs = result["max_diff"][key]
            ax.plot(range(1, len(diffs) + 1), diffs, "o-", color=PALETTE[i], label=f"{n} ranks")
        ax.axhline(FLOAT32_ATOL, color="0.4", linestyle="--", label="assert_close atol (float32)")
        ax.set_yscale("log")
        ax.set_ylim(1e-10, 1e-3)
        ax.set_xlabel("optimizer step")
        ax.set_title(f"max |DDP - single process|, {key}", fontsize=10)
        ax.grid(alpha=0.3)
    _moved_weights(axes[2], reference, sizes)
    if sizes:  # 1 rank alone has nothing to plot on a log scale: its differences are 0
        axes[0].legend(fontsize=8, loc="upper left")
        axes[2].legend(fontsize=8)
    ones = comparison["world_sizes"].get(1)
    if ones is not None:
        worst = max(max(ones["max_diff"]["grads"]), max(ones["max_diff"]["weights"]))
        fig.suptitle(f"1 rank: largest difference {worst:g}", fontsize=9)
    return fig


def _moved_weights(ax, reference: dict, sizes: dict) -> None:
    single = reference["weights"][-1] - reference["initial"]
    for i, (n, result) in enumerate(sizes.items()):
        rank0 = result["per_rank"][0]
        moved = rank0["weights"][-1] - rank0["initial"]
        ax.plot(single.numpy(), moved.numpy(), ".", color=PALETTE[i], alpha=0.6,
                label=f"{n} ranks (rank 0)")
    low, high = single.min().item(), single.max().item()
    ax.plot([low, high], [low, high], color="0.3", linewidth=0.8)
    ax.set_xlabel("single process: change of each weight over the run")
    ax.set_ylabel("DDP: change of each weight")
    ax.set_title("every weight, DDP vs single process", fontsize=10)


def dropout_masks(per_rank: list[dict], policies) -> Figure:
    """Each policy's dropout mask on every rank as one row of cells (dark = dropped)."""
    fig = Figure(figsize=(12, 0.45 * len(per_rank) + 1.4), layout="constrained")
    axes = fig.subplots(1, len(policies))
    for ax, policy in zip(axes, policies):
        masks = torch.stack([r[policy]["mask"].flatten() for r in per_rank]).float().numpy()
        ax.imshow(masks, cmap=ListedColormap(["#333333", "#e8e8e8"]), vmin=0, vmax=1,
                  aspect="auto")
        ax.set_title(policy, fontsize=10)
        ax.set_yticks(range(len(per_rank)), [f"rank {r}" for r in range(len(per_rank))])
        ax.set_xticks([])
        ax.set_xlabel("dropout mask, 64 activations")
    return fig


def shard_coverage(panels: list[tuple[str, list[list[int]]]], n: int) -> Figure:
    """Per panel, which sample each rank gets (a coloured cell per rank and index) and,
    in the bottom row, how often each sample is used in all: 1 everywhere is right,
    0 (missing) and 2+ (duplicate) are marked red."""
    fig = Figure(figsize=(max(6, 0.42 * n + 2), sum(0.32 * (len(s) + 1) + 0.7 for _, s in panels)),
                 layout="constrained")
    axes = fig.subplots(len(panels), 1, squeeze=False)[:, 0]
    for ax, (title, shards) in zip(axes, panels):
        _draw_shards(ax, shards, n)
        ax.set_title(title, fontsize=10, loc="left")
    axes[-1].set_xlabel("sample index in the data set")
    return fig


def _draw_shards(ax, shards: list[list[int]], n: int) -> None:
    for rank, indices in enumerate(shards):
        for i in indices:
            ax.add_patch(_cell(i, rank, PALETTE[rank % len(PALETTE)]))
    bottom = len(shards)
    for i, count in enumerate(coverage(shards, n)):
        ax.text(i + 0.5, bottom + 0.5, str(count), ha="center", va="center", fontsize=9,
                color="#c00000" if count != 1 else "black",
                fontweight="bold" if count != 1 else "normal")
    ax.set_xlim(0, n)
    ax.set_ylim(bottom + 1, 0)
    ax.set_yticks([r + 0.5 for r in range(bottom + 1)],
                  [f"rank {r}" for r in range(bottom)] + ["times used"], fontsize=8)
    ax.set_xticks([i + 0.5 for i in range(n)], [str(i) for i in range(n)], fontsize=8)
    ax.tick_params(length=0)


def _cell(x: float, y: float, color: str):
    from matplotlib.patches import Rectangle
    return Rectangle((x + 0.05, y + 0.1), 0.9, 0.8, facecolor=color, edgecolor="none")


def epoch_orders(panels: list[tuple[str, list[list[int]]]], n: int) -> Figure:
    """The indices one rank visits, in order, one row per epoch: each panel one setting."""
    fig = Figure(figsize=(10, 1.6), layout="constrained")
    axes = fig.subplots(1, len(panels))
    for ax, (title, orders) in zip(axes, panels):
        ax.imshow(orders, cmap="viridis", vmin=0, vmax=n - 1, aspect="auto")
        for epoch, order in enumerate(orders):
            for pos, index in enumerate(order):
                ax.text(pos, epoch, str(index), ha="center", va="center", fontsize=9,
                        color="white" if index < n / 2 else "black")
        ax.set_yticks(range(len(orders)), [f"epoch {e}" for e in range(len(orders))])
        ax.set_xticks([])
        ax.set_title(title, fontsize=10)
    return fig


def resume_plot(runs: dict) -> Figure:
    """Left: loss per step of each run (rank 0). Right: how far each resumed run's weights
    are from the uninterrupted run's at the same step (0 = bit-identical). ``runs`` holds
    "uninterrupted", "first part", "resumed" and any number of "resumed, <what was left
    out>" variants."""
    full = runs["uninterrupted"]
    styles = {"uninterrupted": dict(color="0.6", linewidth=5, alpha=0.5),
              "first part": dict(color=PALETTE[0], marker="o", linestyle="none"),
              "resumed": dict(color=PALETTE[2], marker="s", linestyle="none")}
    variant = dict(color=PALETTE[3], marker="x", linestyle="--")
    fig = Figure(figsize=(11, 3.6), layout="constrained")
    left, right = fig.subplots(1, 2)
    for name, run in runs.items():
        left.plot(run["steps"], run["losses"], label=name, **styles.get(name, variant))
    stop = runs["first part"]["steps"][-1]
    for ax in (left, right):
        ax.axvline(stop + 0.5, color="black", linestyle=":", linewidth=1)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
    left.set_ylabel("loss (rank 0)")
    left.set_title("stopped after step %d, resumed from its checkpoint" % stop, fontsize=10)
    left.legend(fontsize=8)
    for name, run in runs.items():
        if not name.startswith("resumed"):
            continue
        gaps = [(w - full["weights"][s]).abs().max().item()
                for s, w in zip(run["steps"], run["weights"])]
        label = "resumed: 0 at every step (bit-identical)" if name == "resumed" else name
        right.plot(run["steps"], gaps, label=label, **styles.get(name, variant))
    right.set_ylabel("max |w - w uninterrupted|")
    right.set_title("distance from the uninterrupted run", fontsize=10)
    right.legend(fontsize=8)
    return fig
