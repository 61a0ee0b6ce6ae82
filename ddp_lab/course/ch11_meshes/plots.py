"""Notebook 11's figures from the ranks' real tensors and timings: the device mesh and its
groups, DTensor placements before and after each ``redistribute``, and the pipeline
schedules' timelines."""

from __future__ import annotations

import torch
from matplotlib.figure import Figure
from matplotlib.patches import Rectangle

RANK_COLORS = ("#9ecae1", "#a1d99b", "#fdae6b", "#bcbddc", "#fbb4c4", "#99d8c9")
FORWARD, BACKWARD = "#4c72b0", "#dd8452"


def mesh_picture(groups: list[dict]) -> Figure:
    """The 2-D mesh as a grid of ranks, with its "dp" groups (columns) and "tp" groups
    (rows) as returned by each rank."""
    fig = Figure(figsize=(4.2, 3.6), layout="constrained")
    ax = fig.subplots()
    for g in groups:
        row, col = g["coordinate"]
        rank = g["mesh"][row][col]
        ax.add_patch(Rectangle((col, -row), 0.8, 0.8, color=RANK_COLORS[rank]))
        ax.text(col + 0.4, -row + 0.4, f"rank {rank}\ndp {g['groups']['dp']}\ntp {g['groups']['tp']}",
                ha="center", va="center", fontsize=9)
    ax.set_xlim(-0.2, 2)
    ax.set_ylim(-1.2, 1)
    ax.set_xticks([0.4, 1.4], ["tp 0", "tp 1"])
    ax.set_yticks([0.4, -0.6], ["dp 0", "dp 1"])
    ax.set_title('init_device_mesh("cpu", (2, 2))')
    return fig


def _matrix(ax, t: torch.Tensor, x0: float, color: str, y0: float = 0.0) -> float:
    """Draw ``t`` (2-D) as labelled cells from (x0, y0) down; returns the x after it."""
    rows, cols = t.shape
    for r in range(rows):
        for c in range(cols):
            ax.add_patch(Rectangle((x0 + c, y0 - r - 1), 0.95, 0.95, color=color))
            value = t[r, c].item()
            ax.text(x0 + c + 0.47, y0 - r - 0.53, f"{value:g}" if abs(value) < 1000 else f"{value:.0f}",
                    ha="center", va="center", fontsize=6.5)
    return x0 + cols + 0.8


def redistribute_picture(results: list[dict], name: str) -> Figure:
    """Each rank's local tensor before (left) and after (right) one transition, with the
    collectives the trace saw."""
    per_rank = [r[name] for r in results]
    fig = Figure(figsize=(11, 2.6), layout="constrained")
    ax = fig.subplots()
    x = 0.0
    for when in ("before", "after"):
        ax.text(x, 0.6, when, fontsize=9, fontweight="bold")
        for rank, r in enumerate(per_rank):
            ax.text(x, 0.15, f"rank {rank}", fontsize=7)
            x = _matrix(ax, r[when], x, RANK_COLORS[rank])
        x += 1.5
    calls = ", ".join(f"{c} ({b} B, group of {g})" for c, b, g in per_rank[0]["calls"]) or "no communication"
    ax.set_title(f"{name}: {calls}", fontsize=10)
    ax.set_xlim(-0.2, x)
    ax.set_ylim(-max(t.shape[0] for r in per_rank for t in (r["before"], r["after"])) - 0.3, 1.0)
    ax.set_axis_off()
    return fig


def partial_matmul_picture(results: list[dict]) -> Figure:
    """One row per rank: its slices of A (Shard(1)) and B (Shard(0)), their product (the
    Partial summand this rank holds), and the result after redistribute(Replicate())."""
    fig = Figure(figsize=(11, 1.1 * len(results) * 1.5), layout="constrained")
    ax = fig.subplots()
    y, x_end = 0.0, 0.0
    for rank, r in enumerate(results):
        m = r["matmul"]
        ax.text(-0.2, y - 0.5, f"rank {rank}", ha="right", va="center", fontsize=8)
        x = 0.0
        for label, t in (("A, Shard(1)", m["a_local"]), ("@ B, Shard(0)", m["b_local"]),
                         ("= Partial summand", m["partial_local"]),
                         ("redistribute(Replicate()): sum", m["replicated"])):
            if rank == 0:
                ax.text(x, y + 0.3, label, fontsize=8, fontweight="bold")
            x = _matrix(ax, t, x, RANK_COLORS[rank], y)
        x_end = x
        y -= max(m["a_local"].shape[0], m["b_local"].shape[0]) + 0.6
    ax.set_xlim(-1.2, x_end)
    ax.set_ylim(y, 1.0)
    ax.set_title("A @ B with A column-sharded and B row-sharded: each rank's product is a "
                 "summand; one all-reduce adds them", fontsize=10)
    ax.set_axis_off()
    return fig


def pipeline_timelines(results: list[dict], schedules=("GPipe", "1F1B")) -> Figure:
    """One panel per schedule: each stage's forward (blue) and backward (orange) steps,
    labelled with the micro-batch, on the ranks' common clock."""
    fig = Figure(figsize=(11, 1.2 + 1.1 * len(schedules) * len(results) / 2), layout="constrained")
    axes = fig.subplots(len(schedules), 1, squeeze=False)[:, 0]
    for ax, schedule in zip(axes, schedules):
        timelines = [r[schedule]["timeline"] for r in results]
        origin = min(s for spans in timelines for _, s, _ in spans)
        for stage, spans in enumerate(timelines):
            for label, start, end in spans:
                color = FORWARD if label[0] == "F" else BACKWARD
                ax.barh(stage, (end - start) * 1e3, left=(start - origin) * 1e3, color=color,
                        edgecolor="white", height=0.7)
                ax.text((start + end) / 2 * 1e3 - origin * 1e3, stage, label[1:], ha="center",
                        va="center", fontsize=7, color="white")
        ax.set_yticks(range(len(timelines)), [f"stage {s}" for s in range(len(timelines))])
        ax.set_ylim(len(timelines) - 0.5, -0.5)
        ax.set_title(f"{schedule}: forward (blue) and backward (orange) per micro-batch", fontsize=10)
    axes[-1].set_xlabel("ms since the first step started")
    return fig
