"""Notebook 15's figures, from the ranks' own results: the replica group's quorum and loss
over the steps, the three ways to synchronise (loss, bytes, time on the slow link), and the
all-reduces that compress."""

from __future__ import annotations

from matplotlib.figure import Figure

from ddp_lab.course.ch15_resilience import diloco

COLORS = {"DDP": "#4c72b0", "LocalSGD": "#dd8452", "DiLoCo": "#55a868",
          "all-reduce (default)": "#4c72b0", "int8": "#c44e52",
          "int8 + error feedback": "#55a868", "PowerSGD rank 1": "#8172b3"}


def replica_picture(per_rank: list[dict]) -> Figure:
    """Left: which replica took part in which step's quorum (a cross where one healed).
    Right: each replica's loss on its own batch."""
    fig = Figure(figsize=(10, 3), layout="constrained")
    ax_q, ax_l = fig.subplots(1, 2)
    for result in per_rank:
        rank, seen = result["rank"], result["seen"]
        steps = [s["step"] for s in seen]
        ax_q.scatter(steps, [rank] * len(steps), s=40, label=f"replica {rank}")
        healed = [s["step"] for s in seen if str(rank) in s["heal"]]
        ax_q.scatter(healed, [rank] * len(healed), marker="x", s=120, color="black")
        if "left_at" in result:
            ax_q.axvline(result["left_at"] - 0.5, color="#c44e52", ls="--", lw=1)
        ax_l.plot(steps, [s["loss"] for s in seen], marker="o", ms=3, label=f"replica {rank}")
    ax_q.set(xlabel="step", ylabel="replica", title="quorum members per step (x: healed)",
             yticks=[r["rank"] for r in per_rank])
    ax_l.set(xlabel="step", ylabel="loss of its batch", title="loss")
    ax_l.legend(fontsize=8)
    return fig


def sync_picture(per_rank: list[dict], bandwidth: str) -> Figure:
    """Loss of the global batch per step, MB all-reduced per rank and seconds on the link."""
    fig = Figure(figsize=(11, 3), layout="constrained")
    ax_l, ax_b, ax_t = fig.subplots(1, 3, width_ratios=[2, 1, 1])
    for method in diloco.METHODS:
        ax_l.plot(diloco.mean_loss(per_rank, method), label=method, color=COLORS[method])
    ax_l.set(xlabel="step", ylabel="mean loss", title="loss, same data")
    ax_l.legend(fontsize=8)
    first = per_rank[0]
    ax_b.bar(diloco.METHODS, [first[m]["bytes"] / 1e6 for m in diloco.METHODS],
             color=[COLORS[m] for m in diloco.METHODS])
    ax_b.set(ylabel="MB", title="all-reduced per rank")
    slowest = [max(r[m]["seconds"] for r in per_rank) for m in diloco.METHODS]
    ax_t.bar(diloco.METHODS, slowest, color=[COLORS[m] for m in diloco.METHODS])
    ax_t.set(ylabel="s", title=f"training time, {bandwidth}")
    return fig


def compression_picture(per_rank: list[dict]) -> Figure:
    """Left: mean loss per step of each way to all-reduce. Right: the small entries' mean
    over the steps, as sent, against their true values."""
    fig = Figure(figsize=(10, 3), layout="constrained")
    ax_l, ax_s = fig.subplots(1, 2)
    for way, first in per_rank[0]["training"].items():
        curves = [r["training"][way]["loss"] for r in per_rank]
        ax_l.plot([sum(v) / len(v) for v in zip(*curves)], label=f"{way}: "
                  f"{first['bytes'][-1] / 1e3:.0f} kB/step", color=COLORS[way])
    ax_l.set(xlabel="step", ylabel="mean loss", title="training, bytes of the last step")
    ax_l.legend(fontsize=8)
    small = per_rank[0]["small entries"]
    true = small["true"][1:]
    for name, color in (("plain", COLORS["int8"]),
                        ("error feedback", COLORS["int8 + error feedback"])):
        ax_s.scatter(true, small[name][1:], s=4, color=color, label=name)
    ax_s.plot([true.min(), true.max()], [true.min(), true.max()], color="gray", lw=1)
    ax_s.set(xlabel="true value", ylabel="mean of what arrived",
             title=f"entries below half a grid step ({small['grid_step']:.3f})")
    ax_s.tick_params(axis="x", labelrotation=30, labelsize=8)
    ax_s.legend(fontsize=8)
    return fig
