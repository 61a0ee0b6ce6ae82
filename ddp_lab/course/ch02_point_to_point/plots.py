"""Latency and bandwidth against message size, from a real ping-pong (notebook 02)."""

from __future__ import annotations

from matplotlib.figure import Figure

from ddp_lab.course.figures import log_log_axes
from ddp_lab.course.units import format_bytes


def latency_bandwidth(result) -> Figure:
    """Two log-log panels from a ``PingPong``: one-way time (every repeat as a dot, the
    fastest as the line) and bandwidth, with alpha and the peak bandwidth marked."""
    fig = Figure(figsize=(10, 3.8), layout="constrained")
    time_ax, bw_ax = fig.subplots(1, 2)
    _latency_panel(time_ax, result)
    _bandwidth_panel(bw_ax, result)
    fig.suptitle("Ping-pong between rank 0 and rank 1, measured on this machine")
    return fig


def _latency_panel(ax, result) -> None:
    for size in result.sizes:
        one_way = [t / 2 * 1e6 for t in result.round_trips[size]]
        ax.plot([size] * len(one_way), one_way, ".", color="#b0b0b0", ms=4,
                label="every repeat" if size == result.sizes[0] else None)
    ax.plot(result.sizes, [t * 1e6 for t in result.latency], "o-", color="#4c72b0",
            label="fastest of the repeats")
    ax.axhline(result.alpha * 1e6, color="#c44e52", ls="--", lw=1,
               label=f"α ≈ {result.alpha * 1e6:.0f} us (fastest message)")
    log_log_axes(ax, result.sizes, "one-way time (us, log)",
             "Latency: flat (α), then grows with size (β)")


def _bandwidth_panel(ax, result) -> None:
    ax.plot(result.sizes, [b / 1e9 for b in result.bandwidth], "o-", color="#55a868")
    peak = result.peak_bandwidth / 1e9
    ax.axhline(peak, color="#c44e52", ls="--", lw=1, label=f"peak ≈ {peak:.2f} GB/s ≈ 1/β")
    half = result.half_bandwidth_size
    ax.axvline(half, color="#8172b2", ls=":", lw=1.5,
               label=f"n½ = α/β ≈ {format_bytes(round(half))}: half the peak")
    log_log_axes(ax, result.sizes, "bandwidth (GB/s, log)", "Bandwidth: size / one-way time")


def shaped_ping_pong(loopback, shaped, fit, configured_bytes_per_s: float) -> Figure:
    """One-way time against size on loopback and on a shaped link, with the alpha-beta fit
    of the shaped one and the line the configured rate predicts."""
    fig = Figure(figsize=(7.5, 4), layout="constrained")
    ax = fig.subplots()
    for result, label, color in ((loopback, "loopback (network=None)", "#4c72b0"),
                                 (shaped, "shaped link", "#dd8452")):
        ax.plot(result.sizes, [t * 1e6 for t in result.latency], "o-", color=color,
                label=label)
    big = [s for s in shaped.sizes if s >= 1 << 16]
    ax.plot(big, [fit.time(s) * 1e6 for s in big], "--", color="#c44e52",
            label=f"fit: {fit.bandwidth * 8 / 1e6:.0f} Mbit/s")
    ax.plot(big, [s / configured_bytes_per_s * 1e6 for s in big], ":", color="black",
            label=f"configured: {configured_bytes_per_s * 8 / 1e6:.0f} Mbit/s")
    log_log_axes(ax, shaped.sizes, "one-way time (us, log)",
                 "Ping-pong: loopback against a shaped link")
    return fig
