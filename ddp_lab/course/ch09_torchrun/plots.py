"""Notebook 09's figure: an elastic job's workers over time, per node and local rank."""

from __future__ import annotations

from matplotlib.figure import Figure

from ddp_lab.course.timeline import rank_timeline


def elastic_timeline(trace: list[dict], title: str = "") -> Figure:
    """One row per worker slot (node, local rank), one bar per stretch of steps a worker
    process made at one world size, labeled with those steps. ``trace`` holds
    elastic_steps.py's records; nodes are told apart by their agent's pid and numbered in
    order of their first step."""
    records = sorted(trace, key=lambda r: r["start"])
    nodes = list(dict.fromkeys(r["agent_pid"] for r in records))
    slots = sorted({(nodes.index(r["agent_pid"]), r["local_rank"]) for r in records})
    rows = _stretches(records, nodes, slots)
    joined = min((r["start"] for r in records if r["agent_pid"] != nodes[0]), default=None)
    fig = rank_timeline([[(s["label"], s["start"], s["end"]) for s in row] for row in rows],
                        unit="s", marks={"node1's first step": joined} if joined else None,
                        title=title or "--nnodes=1:2: node1 joins, every worker restarts")
    ax = fig.axes[0]
    origin = records[0]["start"]
    for y, row in enumerate(rows):
        for s in row:
            ax.text((s["start"] + s["end"]) / 2 - origin, y, f"steps {s['first']}-{s['last']}",
                    ha="center", va="center", color="white", fontsize=8)
    ax.set_yticks(range(len(slots)), [f"node{n} local rank {lr}" for n, lr in slots])
    ax.set_xlabel("time since node0's first step (s)")
    return fig


def _stretches(records, nodes, slots) -> list[list[dict]]:
    """Consecutive steps of one worker process at one world size, per slot."""
    rows: list[list[dict]] = [[] for _ in slots]
    for record in records:
        row = rows[slots.index((nodes.index(record["agent_pid"]), record["local_rank"]))]
        label = f"world size {record['world_size']}"
        if row and row[-1]["label"] == label and row[-1]["pid"] == record["pid"]:
            row[-1].update(end=record["end"], last=record["step"])
        else:
            row.append({"label": label, "pid": record["pid"], "start": record["start"],
                        "end": record["end"], "first": record["step"], "last": record["step"]})
    return rows


def throughput_bars(samples_per_second: dict[str, float]) -> Figure:
    """Samples per second of each way to train the same model on this machine."""
    fig = Figure(figsize=(7, 0.9 + 0.5 * len(samples_per_second)), layout="constrained")
    ax = fig.subplots()
    names = list(samples_per_second)
    ax.barh(range(len(names)), [samples_per_second[n] for n in names],
            color=["#8c8c8c", "#dd8452", "#4c72b0"][:len(names)])
    for y, name in enumerate(names):
        ax.text(samples_per_second[name], y, f" {samples_per_second[name]:,.0f}", va="center",
                fontsize=8)
    ax.set_yticks(range(len(names)), names)
    ax.set_ylim(len(names) - 0.5, -0.5)
    ax.set_xlim(0, max(samples_per_second.values()) * 1.25)
    ax.set_xlabel("samples per second (same model, same global batch; shared CPU cores)")
    return fig
