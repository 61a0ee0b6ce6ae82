"""Notebook 11b's figures, from what the ranks recorded: each schedule's per-rank timeline
(forward, full backward, input- and weight-gradient backward, the second virtual stage
hatched), and the bubble measured, replayed and predicted."""

from __future__ import annotations

from matplotlib.figure import Figure
from matplotlib.patches import Patch

from ddp_lab.course.ch11_meshes.plots import BACKWARD, FORWARD

COLORS = {"F": FORWARD, "B": BACKWARD, "I": "#c44e52", "W": "#55a868"}
NAMES = {"F": "forward", "B": "backward", "I": "backward to the input (I)",
         "W": "backward to the weights (W)"}


def timelines(panels: list[dict], unit: str = "ms") -> Figure:
    """One panel per ``{"title", "spans", "stages" (optional), "ranks"}``: each rank's
    steps as bars labelled with the micro-batch, on the ranks' common clock (``unit``
    "ms" for seconds measured, "units" for a replay already in cost units). A step of a
    rank's second stage (stage index >= ranks) is hatched."""
    height = sum(0.45 * len(p["spans"]) + 0.7 for p in panels) + 0.6
    fig = Figure(figsize=(11, height), layout="constrained")
    axes = fig.subplots(len(panels), 1, squeeze=False,
                        height_ratios=[len(p["spans"]) + 1.5 for p in panels])[:, 0]
    scale = 1e3 if unit == "ms" else 1.0
    kinds = set()
    for ax, panel in zip(axes, panels):
        kinds |= _panel(ax, panel, scale)
    axes[-1].set_xlabel("ms since the first step started" if unit == "ms" else "cost units")
    fig.legend([Patch(color=COLORS[k]) for k in "FBIW" if k in kinds],
               [NAMES[k] for k in "FBIW" if k in kinds], loc="outside lower center",
               ncol=4, frameon=False)
    return fig


def _panel(ax, panel: dict, scale: float) -> set:
    spans_per_rank = panel["spans"]
    stages = panel.get("stages") or [[0] * len(s) for s in spans_per_rank]
    origin = min(s for spans in spans_per_rank for _, s, _ in spans)
    kinds = set()
    for rank, (spans, of) in enumerate(zip(spans_per_rank, stages)):
        bars: dict = {}  # one broken_barh per (kind, second stage): fast to draw
        for (label, start, end), stage in zip(spans, of):
            bars.setdefault((label[0], stage >= len(spans_per_rank)), []).append(
                ((start - origin) * scale, (end - start) * scale))
            ax.text(((start + end) / 2 - origin) * scale, rank, label[1:], ha="center",
                    va="center", fontsize=6.5, color="white")
        for (kind, second), ranges in bars.items():
            kinds.add(kind)
            ax.broken_barh(ranges, (rank - 0.375, 0.75), facecolors=COLORS[kind],
                           edgecolor="white", hatch="///" if second else None)
    ax.set_yticks(range(len(spans_per_rank)), [f"rank {r}" for r in range(len(spans_per_rank))])
    ax.set_ylim(len(spans_per_rank) - 0.5, -0.5)
    ax.set_title(panel["title"], fontsize=10)
    return kinds


def bubbles(rows: list[dict]) -> Figure:
    """Per schedule, the bubble measured on the ranks' clocks, the bubble of the same
    orders replayed with ideal costs, and the formula (where there is one)."""
    fig = Figure(figsize=(8, 3.2), layout="constrained")
    ax = fig.subplots()
    width = 0.27
    for k, (key, color, text) in enumerate((("measured", "#8c8c8c", "measured"),
                                            ("replayed", "#4c72b0", "replayed, ideal costs"),
                                            ("formula", "#dd8452", "formula"))):
        xs = [i + (k - 1) * width for i, r in enumerate(rows) if r.get(key) is not None]
        ax.bar(xs, [r[key] for r in rows if r.get(key) is not None], width, color=color, label=text)
    ax.set_xticks(range(len(rows)), [r["name"] for r in rows])
    ax.set_ylabel("bubble (idle share)")
    ax.legend(frameon=False)
    ax.grid(axis="y", alpha=0.3)
    return fig
