"""Inside DDP (notebook 07): the bucket layout, the bucket-size sweep, the overlap timeline
of one step on every rank, and what DDP's options cost: bytes and loss with communication
hooks, the all-reduces that ``no_sync`` saves, the memory of the gradient buckets, and the
step time of ``find_unused_parameters`` / ``static_graph``."""

from __future__ import annotations

import matplotlib
from matplotlib.figure import Figure

from ddp_lab.course.timeline import PALETTE, rank_timeline

BUCKET_COLORS = matplotlib.colormaps["tab10"].colors
COMPUTE, FORWARD = "#8fb3d9", "#c9c9c9"


def bucket_map(layouts: list[dict]) -> Figure:
    """One bar per layout, gradients in the order they became ready (left to right), one
    colour per bucket, thin white lines between parameters. The top bar is iteration 0
    (the same for every cap), the others the rebuilt buckets of iteration 1."""
    rows = [("iteration 0 (any cap)", layouts[0]["buckets"][0])]
    rows += [(f"iteration 1, {_cap_text(lay['cap_mb'])}", lay["buckets"][1]) for lay in layouts]
    sizes = dict(layouts[0]["params"])
    fig = Figure(figsize=(10, 0.75 * len(rows) + 1.4), layout="constrained")
    ax = fig.subplots()
    for y, (_, records) in enumerate(rows):
        left = 0.0
        for r in sorted(records, key=lambda r: r["index"]):
            names = r["params"] if y else list(reversed(r["params"]))  # ready order
            _draw_bucket(ax, y, left, names, sizes, BUCKET_COLORS[r["index"] % 10], r["index"])
            left += r["bytes"] / 1e6
    ax.set_yticks(range(len(rows)), [label for label, _ in rows])
    ax.set_ylim(len(rows) - 0.5, -0.5)
    ax.set_xlabel("MB of gradients, in the order backward produces them  →")
    ax.set_title("Which gradient lands in which bucket (b0 leaves first)")
    return fig


def _cap_text(cap_mb) -> str:
    return "default (25 MiB, first bucket 1 MiB)" if cap_mb is None else f"bucket_cap_mb={cap_mb:g}"


def _draw_bucket(ax, y, left, names, sizes, color, index) -> None:
    x = left
    for name in names:
        width = sizes[name] / 1e6
        ax.barh(y, width, left=x, height=0.6, color=color, edgecolor="white", linewidth=0.8)
        if width > 0.35 and name.endswith("weight"):
            ax.text(x + width / 2, y + 0.05, name.split(".")[0], ha="center", va="center",
                    fontsize=8)
        x += width
    ax.text(left + 0.03, y - 0.38, f"b{index}", ha="left", va="bottom", fontsize=8,
            fontweight="bold")


def sweep_curve(result: dict) -> Figure:
    """Median step time against ``bucket_cap_mb`` (each step as a faint dot, the number of
    buckets next to each point; DDP's default as a star at 25), with the references as
    horizontal lines."""
    ms, times = result["ms"], result["times"]
    caps = sorted(c for c in result["caps"] if c is not None)
    fig = Figure(figsize=(8, 4.6), layout="constrained")
    ax = fig.subplots()
    for cap in result["caps"]:
        x = 25 if cap is None else cap
        ax.plot([x] * len(times[cap]), [t * 1e3 for t in times[cap]], ".", color="#4c72b0",
                alpha=0.25)
        ax.annotate(f"{result['buckets'][cap]} bkt", (x, ms[cap]), textcoords="offset points",
                    xytext=(0, -14 if cap is None else 8), ha="center", fontsize=8)
    ax.plot(caps, [ms[c] for c in caps], "o-", color="#4c72b0", label="DDP, median step")
    if None in result["caps"]:
        ax.plot(25, ms[None], "*", color="#dd8452", markersize=13,
                label="DDP's default (25 MiB, first bucket 1 MiB)")
    references = {"no overlap (all-reduce after backward)": ("no overlap", "#c44e52", "--"),
                  "backward only (no communication)": ("backward only", "#55a868", ":")}
    for label, (key, color, style) in references.items():
        ax.axhline(ms[key], color=color, linestyle=style, label=f"{label}: {ms[key]:.0f} ms")
    both = ms["backward only"] + ms["all-reduce only"]
    ax.axhline(both, color="#8172b3", linestyle="-.",
               label=f"backward + one all-reduce of everything: {both:.0f} ms")
    ax.set_xscale("log")
    ax.set_ylim(0, max(max(ms.values()), both) * 1.35)
    ax.set_xlabel("bucket_cap_mb (log scale)")
    ax.set_ylabel("ms per step (forward + backward)")
    ax.set_title(f"Step time against bucket size, {result['world_size']} ranks, "
                 f"{result['gradient_mb']:.0f} MB of gradients")
    ax.legend(fontsize=8, loc="upper left", ncols=2)
    ax.grid(alpha=0.3)
    return fig


def overlap_timeline(timelines: list[dict]) -> Figure:
    """Per rank two lanes, compute (forward, then backward layer by layer) and
    communication (gloo's real run of each all-reduce, recorded by the profiler on the
    worker thread that ran it: one half-lane per thread), for DDP (top) and for all-reduce
    after backward (bottom), on one time axis per panel."""
    fig = Figure(figsize=(10, 2.0 + 1.1 * len(timelines) * 2), layout="constrained")
    axes = fig.subplots(2, 1, sharex=True)
    titles = {"ddp": "DDP: each bucket is all-reduced as soon as its gradients are ready",
              "no_overlap": "No overlap: backward first, then one all-reduce of everything"}
    for ax, (key, title) in zip(axes, titles.items()):
        steps = [t[key] for t in timelines]
        origin = min(s["step"][0] for s in steps)
        for rank, step in enumerate(steps):
            _compute_lane(ax, 2 * rank, step["compute"], origin)
            _comm_lane(ax, 2 * rank + 1, step, origin)
            ax.plot([(step["step"][1] - origin) * 1e3] * 2, [2 * rank - 0.4, 2 * rank + 1.4],
                    color="black", linewidth=1.5)
        ax.set_yticks(range(2 * len(steps)), [f"rank {r} {lane}" for r in range(len(steps))
                                              for lane in ("compute", "all-reduce")])
        ax.set_ylim(2 * len(steps) - 0.5, -0.5)
        ax.set_title(title, fontsize=10)
        ax.grid(axis="x", alpha=0.3)
    axes[-1].set_xlabel("ms since the step started (▼ handed over; bars: gloo running it, "
                        "a half-lane per gloo thread; black line: step done)")
    return fig


def _compute_lane(ax, y, spans, origin) -> None:
    for k, (label, start, end) in enumerate(spans):
        color = FORWARD if label == "forward" else (COMPUTE if k % 2 else "#5b8cc2")
        _bar(ax, y, label, start, end, origin, color, height=0.7)


def _comm_lane(ax, y, step: dict, origin) -> None:
    """Each all-reduce as gloo really ran it, in the half-lane of the worker thread that
    ran it, and a triangle where the Reducer handed the bucket over."""
    threads = sorted(set(step["threads"]))
    for k, ((label, start, end), handed, thread) in enumerate(
            zip(step["comm"], step["handed"], step["threads"])):
        color = PALETTE[1] if k % 2 == 0 else "#f0b27a"
        half = y - 0.18 + 0.36 * threads.index(thread) if len(threads) > 1 else y
        ax.plot((handed - origin) * 1e3, y - 0.42, "v", color=color, markersize=5)
        _bar(ax, half, label, start, end, origin, color, height=0.7 / len(threads))


def _bar(ax, y, label, start, end, origin, color, height) -> None:
    left, width = (start - origin) * 1e3, (end - start) * 1e3
    ax.barh(y, width, left=left, height=height, color=color, edgecolor="white", linewidth=0.5)
    short = label.replace("backward ", "").replace("bucket ", "b")
    if width > 2.5:
        ax.text(left + width / 2, y, short, ha="center", va="center", fontsize=7)


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
    fig = Figure(figsize=(9, 1.4 + 0.6 * len(results)), layout="constrained")
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


def network_bars(results: dict) -> Figure:
    """Step time of each setting (``network_costs.compare``), one panel per lesson: its
    settings on loopback against the same settings on the lesson's link."""
    lessons = [name for name in results if name != "loopback"]
    fig = Figure(figsize=(10, 3.8), layout="constrained")
    for ax, lesson in zip(fig.subplots(1, len(lessons)), lessons):
        shaped = results[lesson]
        settings = list(shaped["ms"])
        for k, (name, color) in enumerate((("loopback", "#8fb3d9"), (lesson, "#dd8452"))):
            xs = [i + (k - 0.5) * 0.4 for i in range(len(settings))]
            label = ("loopback (network=None)" if name == "loopback"
                     else f"links of {shaped['bandwidth']}")
            ax.bar(xs, [results[name]["ms"][s] for s in settings], 0.4, color=color,
                   label=label)
        labels = [s if isinstance(s, str) else _cap_text(s).split(" (")[0] for s in settings]
        ax.set_xticks(range(len(settings)), labels, rotation=20, fontsize=8, ha="right")
        ax.set_ylabel("ms per step (fastest step, slowest rank)")
        ax.set_title(f"{lesson}: loopback hides what the link shows", fontsize=10)
        ax.legend(fontsize=8)
    return fig


def capstone_timeline(per_rank: list[dict], title: str) -> Figure:
    """The step's phases per rank, with a tick where each all-reduce was issued
    (``capstone.step_timeline``): ticks inside the backward bar are the overlap."""
    tick = 2e-4  # s: wide enough to see, narrow enough not to hide its neighbours
    spans = [result["spans"] + [("all-reduce issued", t, t + tick) for t in result["issued"]]
             for result in per_rank]
    return rank_timeline(spans, title=title, colors={"all-reduce issued": "black"})
