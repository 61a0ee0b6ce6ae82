"""Per-rank timelines: what each rank was doing when (notebook 01's barrier, and any later
notebook that times phases on every rank: waiting in a collective, compute vs communication).
"""

from __future__ import annotations

from matplotlib.figure import Figure

PALETTE = ("#4c72b0", "#dd8452", "#55a868", "#c44e52", "#8172b3", "#937860", "#da8bc3")


def rank_timeline(spans_per_rank, *, marks=None, title: str = "", unit: str = "ms",
                  colors=None) -> Figure:
    """One row per rank (rank 0 on top), one bar per ``(label, start, end)`` span.

    ``spans_per_rank[r]`` is rank r's list of spans, in seconds on one clock (time.time()
    on one machine); the plot starts at the earliest start. ``marks`` maps a text to a time
    drawn as a vertical line (e.g. the moment a barrier released). Labels keep one color
    across ranks (``colors`` overrides the palette per label)."""
    scale = {"s": 1.0, "ms": 1e3}[unit]
    origin = min(start for spans in spans_per_rank for _, start, _ in spans)
    color_of = _label_colors(spans_per_rank, colors or {})
    fig = Figure(figsize=(8, 0.6 * len(spans_per_rank) + 1.6), layout="constrained")
    ax = fig.subplots()
    for rank, spans in enumerate(spans_per_rank):
        for label, start, end in spans:
            ax.barh(rank, (end - start) * scale, left=(start - origin) * scale, height=0.6,
                    color=color_of[label], label=label)
    for text, at in (marks or {}).items():
        ax.axvline((at - origin) * scale, color="black", linestyle="--", linewidth=1.2,
                   label=text)
    _dedupe_legend(fig, ax)
    ax.set_yticks(range(len(spans_per_rank)), [f"rank {r}" for r in range(len(spans_per_rank))])
    ax.set_ylim(len(spans_per_rank) - 0.4, -0.6)  # rank 0 on top
    ax.set_xlabel(f"time since the first rank started ({unit})")
    ax.set_title(title)
    ax.grid(axis="x", alpha=0.3)
    return fig


def _label_colors(spans_per_rank, fixed: dict) -> dict:
    """A color per label, in order of first appearance, so a label looks the same on
    every rank."""
    labels = list(dict.fromkeys(label for spans in spans_per_rank for label, _, _ in spans))
    return {label: fixed.get(label, PALETTE[i % len(PALETTE)]) for i, label in enumerate(labels)}


def _dedupe_legend(fig: Figure, ax) -> None:
    """One legend entry per label (every bar was drawn with its label)."""
    handles, labels = ax.get_legend_handles_labels()
    unique = dict(zip(labels, handles))
    fig.legend(unique.values(), unique.keys(), loc="outside lower center", ncol=len(unique),
               frameon=False)
