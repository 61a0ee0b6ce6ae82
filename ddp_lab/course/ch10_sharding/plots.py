"""Notebook 10's figures, each drawn from what the ranks returned: memory per rank by
component and against world size, the bytes each variant communicates per step, and which
rows of a weight each rank holds in a checkpoint saved on N ranks and loaded on M,
FSDP2's step time on loopback and on a slow link, and what two of FSDP2's switches change."""

from __future__ import annotations

import matplotlib
from matplotlib.figure import Figure

from ddp_lab.course.ch10_sharding.memory import COMPONENTS, expected_bytes
from ddp_lab.course.units import MiB

COMPONENT_COLORS = dict(zip(COMPONENTS, ("#4c72b0", "#dd8452", "#55a868")))
RANK_COLORS = matplotlib.colormaps["tab10"].colors
STAGE_OF = {"DDP": "DDP", "ZeRO-1 scratch": "ZeRO-1", "ZeroRedundancyOptimizer": "ZeRO-1",
            "ZeRO-3 scratch": "ZeRO-3", "FSDP2 fully_shard": "ZeRO-3"}


def memory_figure(runs: list[dict]) -> Figure:
    """Left: what rank 0 holds per component, for each variant, at the largest world size.
    Right: rank 0's total against world size, measured (dots) and expected from the ZeRO
    accounting (lines), ZeRO-2 included as expected only."""
    fig = Figure(figsize=(12, 4.2), layout="constrained")
    left, right = fig.subplots(1, 2, width_ratios=(1.3, 1))
    _components(left, runs[-1])
    _against_world_size(right, runs)
    return fig


def _components(ax, run: dict) -> None:
    names = list(run["bytes"])
    bottom = [0.0] * len(names)
    for component in COMPONENTS:
        values = [run["bytes"][n][component] / MiB for n in names]
        ax.bar(range(len(names)), values, bottom=bottom, label=component,
               color=COMPONENT_COLORS[component])
        bottom = [b + v for b, v in zip(bottom, values)]
    ax.set_xticks(range(len(names)), [n.replace(" ", "\n", 1) for n in names], fontsize=8)
    ax.set_ylabel("MiB held by rank 0")
    ax.set_title(f"Where the model state lives, {run['world_size']} ranks (Adam, fp32)")
    ax.legend(fontsize=8)


def _against_world_size(ax, runs: list[dict]) -> None:
    sizes = [r["world_size"] for r in runs]
    parameter_bytes = runs[0]["bytes"]["DDP"]["parameters"]
    for k, stage in enumerate(("DDP", "ZeRO-1", "ZeRO-2", "ZeRO-3")):
        expected = [sum(expected_bytes(stage, parameter_bytes, n).values()) / MiB for n in sizes]
        ax.plot(sizes, expected, "-", color=RANK_COLORS[k], alpha=0.6, label=f"{stage} expected")
        for name in (n for n in runs[0]["bytes"] if STAGE_OF.get(n) == stage):
            measured = [sum(r["bytes"][name].values()) / MiB for r in runs]
            marker = "o" if "scratch" in name or name == "DDP" else "x"
            ax.plot(sizes, measured, marker, color=RANK_COLORS[k], label=f"{name} measured")
    ax.set_xticks(sizes)
    ax.set_xlabel("world size")
    ax.set_ylabel("MiB of model state per rank")
    ax.set_title("Memory per rank against world size")
    ax.legend(fontsize=7, ncol=2)


def traffic_figure(traffic: dict) -> Figure:
    """Bytes each rank sends per step (ring collectives), stacked by collective, relative
    to the parameters' size."""
    variants = traffic["variants"]
    n, size = traffic["world_size"], traffic["parameter_bytes"]
    ops = sorted({name for v in variants.values() for name, _, _ in v["calls"]})
    fig = Figure(figsize=(9, 3.8), layout="constrained")
    ax = fig.subplots()
    bottom = [0.0] * len(variants)
    for k, op in enumerate(ops):
        values = [sum(sent for name, _, sent in v["calls"] if name == op) / size
                  for v in variants.values()]
        # matplotlib's legend skips labels that start with "_": name the c10d ops plainly
        ax.bar(range(len(variants)), values, bottom=bottom, label=op.strip("_"),
               color=RANK_COLORS[k])
        bottom = [b + v for b, v in zip(bottom, values)]
    ax.axhline(2 * (n - 1) / n, color="grey", ls="--", lw=1)
    ax.text(-0.45, 2 * (n - 1) / n, "DDP: 2(n-1)/n", va="bottom", fontsize=8, color="grey")
    ax.set_ylim(0, max(bottom) * 1.25)
    ax.set_xticks(range(len(variants)), [v.replace(" ", "\n", 1) for v in variants], fontsize=8)
    ax.set_ylabel("bytes sent per rank / parameter bytes")
    ax.set_title(f"Communication per training step, {n} ranks (counted)")
    ax.legend(fontsize=8, ncol=4, loc="upper center")
    return fig


def reshard_picture(saved: dict, loaded: list[dict], name: str = "2.weight") -> Figure:
    """Which rows of ``name`` each rank holds: as saved (N ranks), then as loaded (M ranks)."""
    rows = [("saved", [saved[r]["local_shapes"][name][0] for r in range(len(saved))])]
    rows += [(f"loaded on {len(run)}", [v["local_shapes"][name][0] for v in run])
             for run in loaded]
    fig = Figure(figsize=(9, 0.8 * len(rows) + 1.2), layout="constrained")
    ax = fig.subplots()
    for y, (label, counts) in enumerate(rows):
        start = 0
        for rank, count in enumerate(counts):
            ax.barh(y, count, left=start, color=RANK_COLORS[rank], edgecolor="white")
            ax.text(start + count / 2, y, f"rank {rank}\nrows {start}-{start + count - 1}",
                    ha="center", va="center", fontsize=8)
            start += count
    ax.set_yticks(range(len(rows)), [label for label, _ in rows])
    ax.set_ylim(len(rows) - 0.5, -0.5)
    ax.set_xlabel(f"rows of {name} (FSDP2 shards dim 0)")
    ax.set_title("One checkpoint, resharded at load time")
    return fig


def slow_link_figure(results: dict, wire_ms: float) -> Figure:
    """Left: ms per step of each FSDP2 setting on each network (the slowest rank's, fastest
    timed step), with loopback's "blocking" step plus the all-gathers' time on the wire as
    a dashed line: what the step would take if nothing hid them. Right: bytes all-gathered per step by
    each rank, relative to the parameters' bytes."""
    networks = list(results)
    settings = list(results[networks[0]][0]["ms"])
    fig = Figure(figsize=(12, 4), layout="constrained")
    left, right = fig.subplots(1, 2, width_ratios=(1.4, 1))
    width = 0.8 / len(networks)
    for k, network in enumerate(networks):
        ms = [results[network][0]["ms"][s] for s in settings]
        xs = [i + (k - (len(networks) - 1) / 2) * width for i in range(len(settings))]
        left.bar(xs, ms, width, label=network, color=RANK_COLORS[k])
    exposed = results[networks[0]][0]["ms"]["blocking"] + wire_ms
    left.axhline(exposed, color="grey", ls="--", lw=1,
                 label="loopback blocking + its all-gathers on the wire")
    left.set_xticks(range(len(settings)), settings)
    left.set_ylim(0, max(exposed, *(r[0]["ms"][s] for r in results.values() for s in settings))
                  * 1.2)
    left.set_ylabel("ms per step (slowest rank, fastest step)")
    left.set_title("FSDP2 on 2 ranks: loopback against a slow link")
    left.legend(fontsize=8, loc="upper right")
    _all_gathered(right, results[networks[-1]], settings)
    return fig


def _all_gathered(ax, per_rank: list[dict], settings: list[str]) -> None:
    width = 0.8 / len(per_rank)
    for rank, result in enumerate(per_rank):
        values = [result["all_gathered"][s] / result["parameter_bytes"] for s in settings]
        xs = [i + (rank - (len(per_rank) - 1) / 2) * width for i in range(len(settings))]
        ax.bar(xs, values, width, label=f"rank {rank}", color=RANK_COLORS[rank])
    ax.set_xticks(range(len(settings)), settings)
    ax.set_ylabel("bytes all-gathered per step / parameter bytes")
    ax.set_title("What each rank all-gathers per step (counted)")
    ax.legend(fontsize=8)


def fsdp2_switches_figure(feature: dict) -> Figure:
    """Section 8 on one rank's results. Left: bytes all-gathered and reduce-scattered in one
    forward and backward, plain fp32 against the bf16 policy. Right: the collectives of one
    step accumulated over micro-batches, reducing each backward or the last one only."""
    fig = Figure(figsize=(11, 3.6), layout="constrained")
    left, right = fig.subplots(1, 2)
    mixed = feature["mixed precision"]
    _paired_bars(left, {"fp32": mixed["plain_bytes"], "param bf16, reduce fp32": mixed["bytes"]},
                 scale=1 / 1024)
    left.set_ylabel("KiB, full tensors, all calls")
    left.set_title("MixedPrecisionPolicy: bytes of one forward + backward")
    _paired_bars(right, {way: v["counts"] for way, v in feature["accumulation"].items()})
    right.set_ylabel("calls in one accumulated step")
    right.set_title("3 micro-batches: set_requires_gradient_sync")
    return fig


def _paired_bars(ax, series: dict[str, dict[str, float]], scale: float = 1.0) -> None:
    """One group of bars per key (a collective), one bar per series."""
    keys = sorted({k for values in series.values() for k in values})
    width = 0.8 / len(series)
    for i, (label, values) in enumerate(series.items()):
        xs = [j + (i - (len(series) - 1) / 2) * width for j in range(len(keys))]
        ax.bar(xs, [values.get(k, 0) * scale for k in keys], width, label=label,
               color=RANK_COLORS[i])
    ax.set_xticks(range(len(keys)), keys, fontsize=8)
    ax.legend(fontsize=8)
