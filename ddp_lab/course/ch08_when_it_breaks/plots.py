"""Figures for notebook 08 (when it breaks): a straggler's effect on every rank's step time,
and a training run that was killed, restarted by torchrun and resumed."""

from __future__ import annotations

from matplotlib.figure import Figure

from ddp_lab.course.timeline import PALETTE


def step_times(times) -> Figure:
    """Left: every rank's time per step. Right: the mean step split into the rank's own work
    (before ``backward()``) and ``backward()`` (the all-reduce, where fast ranks wait).

    ``times`` is a ``ddp_lab.course.ch08_when_it_breaks.stragglers.StepTimes``."""
    fig = Figure(figsize=(10, 3.6), layout="constrained")
    left, right = fig.subplots(1, 2, gridspec_kw={"width_ratios": [3, 2]})
    for rank, row in enumerate(times.step):
        slow = rank == times.slow_rank
        left.plot([1e3 * s for s in row], marker="os^Dv"[rank % 5], alpha=0.8,
                  color=PALETTE[rank % len(PALETTE)],
                  linestyle="--" if slow else "-",
                  label=f"rank {rank}" + (f" (sleeps {times.delay * 1e3:g} ms)" if slow else ""))
    left.axhline(times.delay * 1e3, color="grey", linewidth=1, linestyle=":")
    left.set_xlabel("step")
    left.set_ylabel("time per step (ms)")
    left.set_ylim(bottom=0)
    left.set_title("every rank runs at the slowest rank's pace")
    left.legend(frameon=False, fontsize=8)
    _work_vs_wait(right, times)
    return fig


def _work_vs_wait(ax, times) -> None:
    ranks = range(len(times.step))
    own, waiting = times.mean_ms("before_backward"), times.waiting_ms()
    ax.barh(ranks, own, color="#4c72b0", label="own work (before backward)")
    ax.barh(ranks, waiting, left=own, color="#dd8452",
            label="backward: all-reduce, waiting for the slowest")
    ax.barh(ranks, times.optimizer_ms(), left=[o + w for o, w in zip(own, waiting)],
            color="#55a868", label="optimizer.step()")
    ax.set_yticks(list(ranks), [f"rank {r}" + (" (slow)" if r == times.slow_rank else "")
                                for r in ranks])
    ax.set_ylim(len(times.step) - 0.4, -0.6)  # rank 0 on top
    ax.set_xlabel("mean time per step (ms), steps 2+")
    ax.set_title("where each rank's step goes")
    ax.legend(frameon=False, fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.25))


def recovery_losses(reference: list[float], attempts: dict[int, dict[int, float]]) -> Figure:
    """Epoch losses of an uninterrupted run (line) and of a run torchrun restarted
    (one marker style per attempt: ``attempts[restart][epoch] = loss``)."""
    fig = Figure(figsize=(7, 3.4), layout="constrained")
    ax = fig.subplots()
    ax.plot(range(len(reference)), reference, color="black", linewidth=2, alpha=0.35,
            label="uninterrupted run")
    markers = ("o", "s", "^", "D")
    for restart, losses in sorted(attempts.items()):
        epochs = sorted(losses)
        ax.plot(epochs, [losses[e] for e in epochs], linestyle="none",
                marker=markers[restart % len(markers)], markersize=9, fillstyle="none",
                markeredgewidth=2, color=PALETTE[restart % len(PALETTE)],
                label=f"torchrun attempt {restart}" + (" (killed after it)" if restart == 0
                                                        and len(attempts) > 1 else ""))
    for restart, losses in sorted(attempts.items())[1:]:
        ax.axvline(min(losses) - 0.5, color="grey", linestyle="--", linewidth=1)
        ax.annotate("worker killed,\ntorchrun restarts,\nresume from checkpoint",
                    (min(losses) - 0.5, max(reference)), fontsize=8, ha="center", va="top",
                    backgroundcolor="white")
    ax.set_xticks(range(len(reference)))
    ax.set_xlabel("epoch")
    ax.set_ylabel("training loss (mean over ranks)")
    ax.legend(frameon=False, fontsize=8)
    return fig


def link_pace(results: dict) -> Figure:
    """Mean step time of every rank (bars), for each network setting (groups)."""
    names = list(results)
    world = len(results[names[0]])
    fig = Figure(figsize=(7.5, 3.6), layout="constrained")
    ax = fig.subplots()
    width = 0.8 / world
    for rank in range(world):
        xs = [i + (rank - (world - 1) / 2) * width for i in range(len(names))]
        ax.bar(xs, [results[n][rank] for n in names], width, label=f"rank {rank}",
               color=PALETTE[rank % len(PALETTE)])
    ax.set_xticks(range(len(names)), names)
    ax.set_ylabel("ms per DDP step (mean)")
    ax.set_title("One slow link: every rank slows down")
    ax.legend(fontsize=8)
    return fig


def profile_timeline(profiles: list) -> Figure:
    """Per rank, from its profiler trace: the main thread (forward, backward, optimizer as
    pale bars, backward operators dark on top) and one lane per gloo worker thread (each
    collective as the thread ran it). ``profiles``: ``profiling.StepProfile`` per rank."""
    lanes = sum(1 + len(p.threads()) for p in profiles)
    fig = Figure(figsize=(10, 1.0 + 0.55 * lanes), layout="constrained")
    ax = fig.subplots()
    origin = min(s.start for p in profiles for s in p.steps)
    y, ticks = 0, []
    for rank, prof in enumerate(profiles):
        phase_colors = {"forward": "#c7c7c7", "backward": "#aec7e8", "optimizer": "#98df8a"}
        for span in prof.phases:
            _span(ax, y, span, origin, phase_colors[span.name], 0.8, span.name)
        for span in prof.backward_ops:
            _span(ax, y, span, origin, PALETTE[0], 0.4)
        ticks.append((y, f"rank {rank} main thread"))
        for k, thread in enumerate(prof.threads(), 1):
            for span in (c for c in prof.collectives if c.thread == thread):
                _span(ax, y + k, span, origin, PALETTE[1], 0.7)
            ticks.append((y + k, f"rank {rank} gloo thread {k}"))
        y += 1 + len(prof.threads())
    for step in profiles[0].steps:
        ax.axvline((step.start - origin) * 1e3, color="grey", linewidth=0.8, linestyle=":")
    ax.set_yticks([t for t, _ in ticks], [label for _, label in ticks])
    ax.set_ylim(y - 0.5, -0.6)
    ax.set_xlabel("ms since the first recorded step (dotted: ProfilerStep boundaries; dark: "
                  "backward operators; orange: gloo collectives)")
    ax.set_title("Two DDP steps from each rank's torch.profiler trace")
    return fig


def _span(ax, y, span, origin, color, height, label=None) -> None:
    left, width = (span.start - origin) * 1e3, (span.end - span.start) * 1e3
    ax.barh(y, width, left=left, height=height, color=color, edgecolor="none")
    if label and width > 8:
        ax.text(left + width / 2, y - 0.3, label, ha="center", va="center", fontsize=7)
