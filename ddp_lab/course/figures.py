"""Axes conventions that several chapters' figures share."""

from __future__ import annotations

from matplotlib.ticker import NullLocator

from ddp_lab.course.units import format_bytes


def log_log_axes(ax, sizes, ylabel: str, title: str) -> None:
    """Both axes logarithmic; message sizes labelled in B/KiB/MiB at every other point."""
    ax.set_yscale("log")
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.legend(loc="upper left", fontsize=8)
    ax.set_xscale("log", base=2)
    ticks = sizes[::2]
    ax.xaxis.set_minor_locator(NullLocator())
    ax.set_xticks(ticks, [format_bytes(s) for s in ticks], rotation=45, fontsize=8)
    ax.set_xlabel("message size")
    ax.grid(True, which="major", alpha=0.3)
