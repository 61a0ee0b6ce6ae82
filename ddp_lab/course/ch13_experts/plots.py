"""Notebook 13's figures from the ranks' real routing and timings: tokens per expert (by the
rank they came from) and per receiving rank, the aux loss's effect over training, dropped
tokens against the capacity factor, and the all-to-all's share of a step."""

from __future__ import annotations

from matplotlib.figure import Figure

RANK_COLORS = ("#9ecae1", "#a1d99b", "#fdae6b", "#bcbddc", "#fbb4c4", "#99d8c9")
RUN_COLORS = {"without": "#dd8452", "with": "#4c72b0", "dropless": "#55a868"}
RUN_LABELS = {"without": "capacity, no aux loss", "with": "capacity + aux loss",
              "dropless": "no capacity, no aux loss"}


def runs(per_rank: list[dict]) -> list[str]:
    return [run for run in RUN_COLORS if run in per_rank[0]]


def task_loss(per_rank: list[dict], run: str) -> list[float]:
    """The task loss at each step, averaged over the ranks' batches."""
    histories = [r[run]["history"] for r in per_rank]
    return [sum(h[s]["loss"] for h in histories) / len(histories) for s in range(len(histories[0]))]


def load_at(per_rank: list[dict], run: str, step: int) -> list[list[int]]:
    """requested[rank][expert] at one step of one run."""
    return [r[run]["history"][step]["requested"] for r in per_rank]


def load_picture(per_rank: list[dict], run: str, step: int, capacity_per_rank: int) -> Figure:
    """Left: assignments per expert, stacked by the rank that sent them, with the capacity
    summed over the ranks (each rank's part is capped on its own, so the drops are at least
    the excess over that line, and an expert under it can drop too).
    Right: assignments each rank's experts receive (what its all-to-all brings in)."""
    requested = load_at(per_rank, run, step)
    world, experts = len(requested), len(requested[0])
    local = experts // world
    fig = Figure(figsize=(10, 3), layout="constrained")
    ax_e, ax_r = fig.subplots(1, 2, width_ratios=[2, 1])
    bottom = [0] * experts
    for rank, counts in enumerate(requested):
        ax_e.bar(range(experts), counts, bottom=bottom, color=RANK_COLORS[rank], label=f"from rank {rank}")
        bottom = [b + c for b, c in zip(bottom, counts)]
    ax_e.axhline(capacity_per_rank * world, color="k", ls="--", lw=1, label=f"{world} x capacity {capacity_per_rank}")
    ax_e.set_xticks(range(experts), [f"e{e}\n(rank {e // local})" for e in range(experts)], fontsize=8)
    ax_e.set_ylabel("assignments")
    ax_e.set_title(f"router load per expert, {RUN_LABELS[run]}, step {step}", fontsize=10)
    ax_e.legend(fontsize=7, ncol=2, loc="upper left")
    per_rank_in = [sum(bottom[r * local:(r + 1) * local]) for r in range(world)]
    ax_r.bar([f"rank {r}" for r in range(world)], per_rank_in, color=RANK_COLORS[:world])
    ax_r.set_title("assignments per receiving rank", fontsize=10)
    return fig


def aux_picture(per_rank: list[dict]) -> Figure:
    """Over the steps, for each run: busiest expert / mean, share of the assignments
    dropped, and the task's loss (mean over the ranks' batches)."""
    fig = Figure(figsize=(11, 3), layout="constrained")
    axes = fig.subplots(1, 3)
    for run in runs(per_rank):
        color = RUN_COLORS[run]
        steps = range(len(per_rank[0][run]["history"]))
        imbalance, dropped = [], []
        for s in steps:
            totals = [sum(c) for c in zip(*load_at(per_rank, run, s))]
            imbalance.append(max(totals) / (sum(totals) / len(totals)))
            dropped.append(sum(r[run]["history"][s]["dropped"] for r in per_rank) / sum(totals))
        axes[0].plot(steps, imbalance, color=color, label=RUN_LABELS[run])
        axes[1].plot(steps, dropped, color=color)
        axes[2].plot(steps, task_loss(per_rank, run), color=color)
    for ax, title in zip(axes, ("busiest expert / mean load", "share of assignments dropped",
                                "task loss (MSE, mean of the ranks)")):
        ax.set_title(title, fontsize=10)
        ax.set_xlabel("step")
    axes[0].legend(fontsize=8)
    return fig


def capacity_picture(per_rank: list[dict]) -> Figure:
    """Share of assignments dropped against the capacity factor, after training."""
    fig = Figure(figsize=(5, 3), layout="constrained")
    ax = fig.subplots()
    for run in runs(per_rank):
        color = RUN_COLORS[run]
        factors = sorted(per_rank[0][run]["capacity"])
        shares = [sum(r[run]["capacity"][f] for r in per_rank) / len(per_rank) for f in factors]
        ax.plot(factors, shares, "o-", color=color, label=f"router trained with {RUN_LABELS[run]}")
    ax.set_xlabel("capacity factor")
    ax.set_ylabel("share dropped")
    ax.set_title("dropped tokens vs capacity (trained routers)", fontsize=10)
    ax.legend(fontsize=8)
    return fig


def link_picture(links: dict) -> Figure:
    """Each link's step time (slowest rank, median step), split into all-to-all and the rest."""
    fig = Figure(figsize=(5, 3), layout="constrained")
    ax = fig.subplots()
    names = list(links)
    comm, rest = [], []
    for name in names:
        step = median_step(links[name])
        comm.append(step["comm"] * 1e3)
        rest.append((step["step"] - step["comm"]) * 1e3)
    ax.bar(names, comm, color="#c44e52", label="all-to-alls")
    ax.bar(names, rest, bottom=comm, color="#8c8c8c", label="everything else")
    ax.set_ylabel("ms per step")
    ax.set_title("one expert-parallel training step", fontsize=10)
    ax.legend(fontsize=8)
    return fig


def median_step(per_rank: list[dict]) -> dict:
    """The step whose slowest-rank time is the median, as seen by that slowest rank."""
    steps = list(zip(*[r["steps"] for r in per_rank]))
    slowest = sorted((max(ranks, key=lambda s: s["step"]) for ranks in steps), key=lambda s: s["step"])
    return slowest[len(slowest) // 2]
