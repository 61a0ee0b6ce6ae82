"""Notebook 12's figures, from what the ranks computed and measured: the online softmax
block by block, the causal work per rank and ring step (contiguous vs zig-zag), memory
against sequence length, and ring vs all-to-all on loopback and on a slow link."""

from __future__ import annotations

from matplotlib.figure import Figure

from ddp_lab.course.units import MiB

LAYOUT_COLORS = {"contiguous": "#dd8452", "zigzag": "#4c72b0"}
HOW_COLORS = {"ring": "#4c72b0", "ulysses": "#55a868", "one process": "#c44e52"}


def online_softmax_picture(result: dict) -> Figure:
    """The running max and sum after each block, and how far the running output is from
    softmax over the whole row."""
    steps = result["steps"]
    blocks = range(1, len(steps) + 1)
    fig = Figure(figsize=(10, 2.8), layout="constrained")
    ax_m, ax_l, ax_err = fig.subplots(1, 3)
    ax_m.plot(blocks, [s["m"] for s in steps], "o-")
    ax_m.set_title("running max m")
    ax_l.plot(blocks, [s["l"] for s in steps], "o-")
    ax_l.set_title("running sum l = Σ exp(s - m)")
    errors = [(s["out"] - result["exact"]).abs().max().item() for s in steps]
    ax_err.plot(blocks, [max(e, 1e-9) for e in errors], "o-")
    ax_err.set_yscale("log")
    ax_err.set_title("|output so far - softmax(row) @ V|")
    for ax in (ax_m, ax_l, ax_err):
        ax.set_xlabel("blocks folded in")
        ax.set_xticks(list(blocks))
    return fig


def balance_picture(grids: dict, busy: list[dict]) -> Figure:
    """Left: score entries computed per rank and ring step, both layouts. Right: each rank's
    measured CPU time in block computations."""
    fig = Figure(figsize=(11, 3.2), layout="constrained")
    axes = fig.subplots(1, 3, width_ratios=[1, 1, 1.3])
    top = max(max(max(row) for row in g) for g in grids.values())
    for ax, (layout, grid) in zip(axes, grids.items()):
        ax.imshow(grid, cmap="Blues", vmin=0, vmax=top)
        for r, row in enumerate(grid):
            for s, value in enumerate(row):
                ax.text(s, r, f"{value / 1024:.0f}K", ha="center", va="center", fontsize=8)
        ax.set_title(f"{layout}: score entries\n(total per rank {[sum(row) // 1024 for row in grid]}K)",
                     fontsize=9)
        ax.set_xticks(range(len(grid[0])))
        ax.set_yticks(range(len(grid)))
        ax.set_xlabel("ring step")
        ax.set_ylabel("rank")
    ax = axes[2]
    ranks = range(len(busy))
    for i, layout in enumerate(grids):
        ax.bar([r + 0.4 * i - 0.2 for r in ranks], [b[layout] * 1e3 for b in busy], width=0.4,
               color=LAYOUT_COLORS[layout], label=layout)
    ax.set_xticks(list(ranks), [f"rank {r}" for r in ranks])
    ax.set_ylabel("ms of CPU in blocks")
    ax.set_title("measured: one causal forward", fontsize=9)
    ax.legend(fontsize=8)
    return fig


def memory_picture(memory: dict, world: int) -> Figure:
    """The largest tensor a rank makes against sequence length."""
    fig = Figure(figsize=(5.5, 3.4), layout="constrained")
    ax = fig.subplots()
    seqs = sorted(memory)
    for how in ("one process", "ring", "ulysses"):
        ax.plot(seqs, [memory[s][how] / MiB for s in seqs], "o-", color=HOW_COLORS[how],
                label=how if how == "one process" else f"{how}, {world} ranks")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log", base=2)
    ax.set_xticks(seqs, [str(s) for s in seqs])
    ax.set_xlabel("sequence length")
    ax.set_ylabel("largest tensor (MiB)")
    ax.set_title("memory per rank: the biggest allocation of one forward")
    ax.legend(fontsize=8)
    return fig


def link_picture(links: dict) -> Figure:
    """Bytes each rank sends per forward, and the forward's time on each link."""
    fig = Figure(figsize=(9, 3), layout="constrained")
    ax_bytes, ax_time = fig.subplots(1, 2)
    first = next(iter(links.values()))[0]
    hows = list(first)
    ax_bytes.bar(hows, [first[h]["sent"] / 1024 for h in hows], color=[HOW_COLORS[h] for h in hows])
    ax_bytes.set_ylabel("KiB sent per rank")
    ax_bytes.set_title("one causal forward (traced)")
    names = list(links)
    for i, how in enumerate(hows):
        ax_time.bar([j + 0.4 * i - 0.2 for j in range(len(names))],
                    [links[n][0][how]["seconds"] * 1e3 for n in names], width=0.4,
                    color=HOW_COLORS[how], label=how)
    ax_time.set_xticks(range(len(names)), names)
    ax_time.set_ylabel("ms per forward (slowest rank)")
    ax_time.set_title("measured")
    ax_time.legend(fontsize=8)
    return fig
