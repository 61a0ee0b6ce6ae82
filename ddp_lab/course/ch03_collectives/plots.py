"""Before/after pictures of collectives, and bar charts of what they cost (notebook 03).

``collective_picture`` draws what every rank really held before and after a collective: one
row per rank, one coloured cell per value. A cell's colour is the rank that held the value
before the call, so data movement is visible; values a reduction computed are gold.
"""

from __future__ import annotations

import torch
from matplotlib.figure import Figure
from matplotlib.patches import Rectangle

RANK_COLOURS = ("#9ecae1", "#a1d99b", "#fdae6b", "#bcbddc", "#fbb4c4", "#99d8c9", "#d9d9d9",
                "#c7e9c0")
COMPUTED = "#ffd84d"
GROUP_GAP = 0.35  # space between the tensors of a list, in cell widths


def _groups(held) -> list[list]:
    """A rank's holding as lists of plain numbers: None -> [], a tensor -> one group,
    a list of tensors -> one group per tensor."""
    if held is None:
        return []
    if isinstance(held, (list, tuple)) and held and isinstance(held[0], torch.Tensor):
        return [t.reshape(-1).tolist() for t in held]
    return [torch.as_tensor(held).reshape(-1).tolist()]


def _width(groups: list[list]) -> float:
    return sum(len(g) for g in groups) + GROUP_GAP * max(0, len(groups) - 1) if groups else 1.0


def _label(value) -> str:
    if isinstance(value, bool):
        return "T" if value else "F"
    if isinstance(value, float) and not value.is_integer():
        return f"{value:.3g}"
    return str(int(value))


def _owners(befores: list) -> dict:
    """Value -> the first rank that held it before the call."""
    owners = {}
    for rank in reversed(range(len(befores))):
        for group in _groups(befores[rank]):
            owners.update({v: rank for v in group})
    return owners


def _draw_row(ax, groups, x0: float, y: float, colour_of) -> None:
    if not groups:
        ax.text(x0 + 0.5, y, "—", ha="center", va="center", color="0.5", fontsize=12)
        return
    x = x0
    for group in groups:
        for value in group:
            ax.add_patch(Rectangle((x, y - 0.4), 1, 0.8, facecolor=colour_of(value),
                                   edgecolor="0.25", linewidth=0.8))
            ax.text(x + 0.5, y, _label(value), ha="center", va="center", fontsize=9)
            x += 1
        x += GROUP_GAP


def collective_picture(name: str, befores: list, afters: list, *,
                       reduction: bool | None = None) -> Figure:
    """One row per rank: what it held before (left) and after (right) collective ``name``.

    Each entry of ``befores``/``afters`` is a tensor, a list of tensors (drawn as separate
    blocks: gather, all_gather, scatter...) or None (a rank that holds nothing, e.g. a
    non-root rank of gather). ``reduction`` (default: "reduce" in name) paints every after
    value gold, since a reduced value belongs to no single rank.
    """
    reduction = "reduce" in name if reduction is None else reduction
    before_groups = [_groups(b) for b in befores]
    after_groups = [_groups(a) for a in afters]
    left = max(_width(g) for g in before_groups)
    right_x0 = left + max(4.0, 0.24 * len(name) + 1.2)  # room for the name over the arrow
    right = max(_width(g) for g in after_groups)
    owners = _owners(befores)

    def before_colour(value):
        return RANK_COLOURS[owners[value] % len(RANK_COLOURS)]

    def after_colour(value):
        return COMPUTED if reduction or value not in owners else before_colour(value)

    n = len(befores)
    fig = Figure(figsize=(0.42 * (right_x0 + right + 1.6), 0.5 * n + 1.0), layout="constrained")
    ax = fig.subplots()
    for rank in range(n):
        ax.text(-0.3, -rank, f"rank {rank}", ha="right", va="center", fontsize=10)
        _draw_row(ax, before_groups[rank], 0.0, -rank, before_colour)
        _draw_row(ax, after_groups[rank], right_x0, -rank, after_colour)
    middle = -(n - 1) / 2
    ax.annotate("", xy=(right_x0 - 0.4, middle), xytext=(left + 0.4, middle),
                arrowprops={"arrowstyle": "-|>", "lw": 2, "color": "0.3"})
    ax.text((left + right_x0) / 2, middle + 0.3, name, ha="center", va="bottom",
            fontsize=10, fontweight="bold")
    ax.text(left / 2, 0.75, "before", ha="center", fontsize=10, color="0.35")
    ax.text(right_x0 + right / 2, 0.75, "after", ha="center", fontsize=10, color="0.35")
    caption = ("gold: values the reduction computed" if reduction else
               "colour: the rank each value came from")
    ax.text(-2.2, -n + 0.3, caption, ha="left", va="top", fontsize=8, color="0.4")
    ax.set_xlim(-2.2, right_x0 + right + 0.2)
    ax.set_ylim(-n - 0.1, 1.2)
    ax.set_axis_off()
    return fig


def results_picture(name: str, results: list) -> Figure:
    """collective_picture from the ranks' return values, each {"before": ..., "after": ...}."""
    return collective_picture(name, [r["before"] for r in results], [r["after"] for r in results])


def timing_bars(seconds: dict, title: str) -> Figure:
    """Horizontal bars, one per case, labelled in milliseconds, first case on top."""
    names = list(seconds)
    ms = [seconds[n] * 1e3 for n in names]
    fig = Figure(figsize=(7.5, 0.45 * len(names) + 1.1), layout="constrained")
    ax = fig.subplots()
    bars = ax.barh(names, ms, color="#4c72b0")
    ax.bar_label(bars, labels=[f"{m:.2f} ms" for m in ms], padding=4)
    ax.set_xlim(0, max(ms) * 1.3)
    ax.invert_yaxis()
    ax.set_xlabel("milliseconds per call (median), measured on this machine")
    ax.set_title(title)
    return fig
