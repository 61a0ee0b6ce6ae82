"""Notebook 14's figures, from this run's results: the alpha-beta fits on the link, each
plan's predicted step time (compute and communication) against the measured one, the state
each rank holds, and the cluster-scale sweep of the same model on paper."""

from __future__ import annotations

from matplotlib.figure import Figure

from ddp_lab.course.ch14_planning.calibrate import SIZES
from ddp_lab.course.ch14_planning.costs import predicted_state

STATE_COLORS = {"parameters": "#4c72b0", "gradients": "#dd8452", "optimizer": "#55a868"}


def fits(result: dict) -> Figure:
    """Measured seconds per call at each size (dots) and the fitted alpha + beta x bytes."""
    fig = Figure(figsize=(10, 3.2), layout="constrained")
    ax = fig.subplots()
    for k, (kind, times) in enumerate(result["collectives"].items()):
        color = f"C{k}"
        fit = result["fits"][kind]
        ax.loglog(SIZES, [t * 1e3 for t in times], "o", color=color)
        ax.loglog(SIZES, [fit.predict(s) * 1e3 for s in SIZES], "-", color=color,
                  label=f"{kind}: α {fit.alpha * 1e3:.2f} ms, {1 / fit.beta / 1e6:.0f} MB/s")
    ax.set_xlabel("bytes of the full tensor")
    ax.set_ylabel("ms per call")
    ax.set_title(f"collectives on 4 ranks, links of {result['bandwidth']}: measured (dots), "
                 "fitted α + β·bytes (lines)")
    ax.legend(fontsize=7, loc="upper left")
    return fig


def predicted_vs_measured(result: dict, factor: float) -> Figure:
    """Left: per plan, predicted compute and communication (stacked) beside the measured step.
    Right: measured against predicted, with the band the notebook asserts."""
    names = list(result["predicted"])
    fig = Figure(figsize=(11, 3.6), layout="constrained")
    ax, ax2 = fig.subplots(1, 2, width_ratios=[3, 2])
    xs = range(len(names))
    compute = [result["predicted"][n]["compute"] * 1e3 for n in names]
    comm = [result["predicted"][n]["comm"] * 1e3 for n in names]
    measured = [result["measured_ms"][n] for n in names]
    ax.bar([x - 0.2 for x in xs], compute, 0.4, color="#8c8c8c", label="predicted compute")
    ax.bar([x - 0.2 for x in xs], comm, 0.4, bottom=compute, color="#4c72b0",
           label="predicted communication (PP: slot overhead)")
    ax.bar([x + 0.2 for x in xs], measured, 0.4, color="#dd8452", label="measured step")
    ax.set_xticks(list(xs), names)
    ax.set_ylabel("ms per step")
    ax.set_title("the same MLP, six plans, 4 ranks on the shaped link")
    ax.legend(fontsize=8)
    predicted = [c + m for c, m in zip(compute, comm)]
    top = max(predicted + measured) * 1.3
    ax2.plot([0, top], [0, top], "k-", lw=0.8)
    ax2.fill_between([0, top], [0, top / factor], [0, top * factor], color="#dddddd",
                     label=f"within {factor:g}x")
    for k, n in enumerate(names):
        ax2.plot(predicted[k], measured[k], "o", color=f"C{k}", label=n)
    ax2.set_xlim(0, top)
    ax2.set_ylim(0, top)
    ax2.set_xlabel("predicted ms")
    ax2.set_ylabel("measured ms")
    ax2.legend(fontsize=7)
    return fig


def state_per_rank(result: dict) -> Figure:
    """Bytes of state on rank 0 per plan, as measured (bars), the model's total as a tick."""
    names = list(result["predicted"])
    fig = Figure(figsize=(8, 3), layout="constrained")
    ax = fig.subplots()
    for k, name in enumerate(names):
        measured, bottom = result["per_rank"][0][name]["state"], 0
        for part, color in STATE_COLORS.items():
            ax.bar(k, measured[part] / 2**20, bottom=bottom, color=color,
                   label=part if k == 0 else None)
            bottom += measured[part] / 2**20
        model = sum(predicted_state(name, result["config"], 0).values()) / 2**20
        ax.plot([k - 0.4, k + 0.4], [model, model], "k-", lw=2,
                label="memory model" if k == 0 else None)
    ax.set_xticks(range(len(names)), names)
    ax.set_ylabel("MiB on rank 0")
    ax.set_title("parameters, gradients and Adam state held per rank")
    ax.legend(fontsize=8)
    return fig


def cluster_sweep(sweep: dict, hbm: float) -> Figure:
    """Left: step time against width per plan (hollow: does not fit in memory even with
    checkpointing). Right: memory per GPU against width."""
    fig = Figure(figsize=(11, 3.6), layout="constrained")
    ax, ax2 = fig.subplots(1, 2)
    widths = list(sweep)
    for k, name in enumerate(sweep[widths[0]]):
        seconds = [sweep[w][name]["seconds"] for w in widths]
        memory = [sweep[w][name]["memory"] / 1e9 for w in widths]
        ax.loglog(widths, seconds, "-", color=f"C{k}", label=name)
        ax2.loglog(widths, memory, "-", color=f"C{k}", label=name)
        out = [(w, s) for w, s in zip(widths, seconds) if not sweep[w][name]["fits"]]
        if out:
            ax.plot(*zip(*out), "o", mfc="none", color=f"C{k}", ms=4)
    ax2.axhline(hbm / 1e9, color="k", lw=0.8, ls="--", label="80 GB")
    ax.set_xlabel("width (parameters = layers x width²)")
    ax.set_ylabel("seconds per step")
    ax.set_title("64 GPUs on paper (hollow: does not fit)")
    ax2.set_xlabel("width")
    ax2.set_ylabel("GB per GPU")
    ax.legend(fontsize=7)
    ax2.legend(fontsize=7)
    return fig
