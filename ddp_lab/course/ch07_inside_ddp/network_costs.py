"""Notebook 07 on a network: the bucket size, overlap and compression where the link, not
the CPU, is the limit, next to the same steps on loopback.

On loopback an all-reduce of a few MB takes a millisecond or two, so whatever DDP does to
hide or shrink it cannot show: every setting costs the backward pass. On shaped links
(``ddp_lab.Network``, one link per rank) communicating the gradients takes as long as
computing them or longer, the situation DDP was designed for (Li et al., VLDB 2020):
https://arxiv.org/abs/2006.15704

Two lessons need two links. Overlap hides the all-reduce behind the backward pass only, so
it gains most where the two take about as long; compression gains where the link
dominates the step. Each lesson runs on a link of its own rate (COMM_TO_COMPUTE), picked
from the computation the loopback run measured on this machine.

All settings of a run take turns step by step (as bucket_sweep.py does), so a burst of
load from elsewhere hits them alike; each number is the fastest of the timed steps (the
slowest rank's time in each): load from elsewhere only ever adds time, and on a shared
2-core machine it moved the computation alone between 55 and 110 ms per step.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook

from ddp_lab.course.ch07_inside_ddp.bucket_sweep import bucket_count, cap_label
from ddp_lab.course.ch07_inside_ddp.steps import ddp_step, plain_step
from ddp_lab.course.models import MLPConfig
from ddp_lab.course.timing import time_in_turns

# 8 layers of 512 x 512: 8.4 MB of gradients in 16 tensors. Many equal layers keep the
# last bucket small: it leaves when backward is over, so overlap can never hide it.
NETWORK_MODEL = MLPConfig(inputs=512, width=512, depth=8, outputs=512)
# The all-reduce's time over the computation's (forward + backward) on each lesson's link.
# Overlap: at 1.0 the all-reduce takes as long as forward and backward together. No overlap
# then costs F + B + C = 2 units; perfect overlap hides C behind backward and what follows,
# about F + C = 1.33 units (1.5x at most, less the last bucket). A faster link promises more
# on paper (at 0.7, 1.65x), but on 2 CPU cores gloo's threads and the kernel's network work
# take cycles from backward, and measured less: at batch 512 on the development machine,
# 0.7 gave 1.28x and 1.0 gave 1.33x (ddp-lab bench ddp-network). Compression: at 3 the link
# dominates; with backward hidden under it, no hook costs about F + C = 3.3 units, fp16's
# half of the bytes 1.8 (1.8x), PowerSGD's few KB little more than the computation and its
# own work.
COMM_TO_COMPUTE = {"overlap": 1.0, "compression": 3.0}
LESSONS = tuple(COMM_TO_COMPUTE)
HOOK_CAP = 1.0  # MB: fp16 and its baseline use small buckets, so they overlap too
# PowerSGD waits for its second all-reduce inside the first one's callback; with several
# buckets in flight on gloo, two ranks hung there in different buckets (seen here, torch
# 2.13). One bucket keeps its collectives in one order; it sends so little that overlap
# would not matter. (powerSGD_hook.py: compute_qs, unpack_uncompressed_tensors_and_allreduce_ps)
POWERSGD_CAP = 1000


@dataclass(frozen=True)
class StepConfig:
    """``caps``: the bucket_cap_mb values of the overlap lesson (None: DDP's default); the
    compression lesson's baseline ("no hook") is DDP at HOOK_CAP."""

    caps: tuple = (0.001, HOOK_CAP, None, 1000)
    model: MLPConfig = NETWORK_MODEL
    batch: int = 256
    warmup: int = 3  # PowerSGD compresses from its third step (start_powerSGD_iter=2)
    iterations: int = 5


def settings(config: StepConfig, lesson: str) -> list:
    """What each lesson times: the caps against no overlap, or no hook against the hooks;
    both against the computation alone."""
    if lesson == "overlap":
        return [*config.caps, "no overlap", "compute only"]
    if lesson == "compression":
        return [HOOK_CAP, "fp16 hook", "PowerSGD hook", "compute only"]
    raise ValueError(f"lesson={lesson!r}: use one of {LESSONS}")


def _powersgd_state():
    return powerSGD_hook.PowerSGDState(process_group=None, matrix_approximation_rank=1,
                                       start_powerSGD_iter=2, min_compression_rate=2)


def _make_step(config: StepConfig, x, setting):
    """``(ddp or None, step)`` for the step ``setting`` names: no overlap or the computation
    alone (``plain_step``), a hook on DDP, or DDP at a bucket cap (``ddp_step``)."""
    if setting in ("no overlap", "compute only"):
        return None, plain_step(config.model, x, communicate=setting == "no overlap")
    if setting == "fp16 hook":
        return ddp_step(config.model, x, HOOK_CAP, (None, default_hooks.fp16_compress_hook))
    if setting == "PowerSGD hook":
        return ddp_step(config.model, x, POWERSGD_CAP,
                        (_powersgd_state(), powerSGD_hook.powerSGD_hook))
    return ddp_step(config.model, x, setting)


def step_times(config: StepConfig = StepConfig(), lessons: tuple = LESSONS) -> dict:
    """On each rank: {"ms": {setting: fastest step in ms}, "buckets": {cap: buckets DDP
    built}, ...} for every setting of ``lessons``, each built once (caps first, then
    "no overlap", "compute only", the hooks)."""
    x = torch.randn(config.batch, config.model.inputs,
                    generator=torch.Generator().manual_seed(dist.get_rank()))
    names = dict.fromkeys(s for lesson in lessons for s in settings(config, lesson))
    built = {name: _make_step(config, x, name) for name in names}
    times = time_in_turns({name: step for name, (_, step) in built.items()},
                          config.warmup, config.iterations)
    return {"ms": {name: min(t) * 1e3 for name, t in times.items()},
            "buckets": {cap: bucket_count(built[cap][0])
                        for cap in config.caps if cap in built},
            "caps": list(config.caps), "lessons": list(lessons),
            "gradient_mb": config.model.parameters * 4 / 1e6}


def compare(config: StepConfig = StepConfig(), bandwidths: dict | None = None,
            timeout: float = 120.0) -> dict:
    """{"loopback": every setting on loopback, "overlap": ..., "compression": ...}, each
    as ``step_times`` returns it (rank 0's copy); a shaped run also holds its link's
    "bandwidth": ``bandwidths[lesson]`` if given, else ``matching_bandwidth`` of the
    loopback run (this machine, at its load right now)."""
    results = {"loopback": _run(config, LESSONS, None, timeout)}
    for lesson in LESSONS:
        rate = (bandwidths or {}).get(lesson) or matching_bandwidth(
            results["loopback"], COMM_TO_COMPUTE[lesson])
        results[lesson] = {**_run(config, (lesson,), rate, timeout), "bandwidth": rate}
    return results


# The lessons time CPU steps against a link. On a machine with CUDA the ranks must not see
# it: PowerSGD's hook calls torch.cuda.synchronize(bucket's device) whenever CUDA is
# available, which fails on CPU tensors (workload.powersgd_cuda_sync_lines).
CPU_ONLY = {"CUDA_VISIBLE_DEVICES": ""}


def _run(config: StepConfig, lessons: tuple, bandwidth: str | None, timeout: float) -> dict:
    import ddp_lab
    network = ddp_lab.Network(bandwidth) if bandwidth else None
    return ddp_lab.run(step_times, world_size=2, args=(config, lessons), backend="gloo",
                       timeout=timeout, env=CPU_ONLY, network=network, echo=False)[0]


def matching_bandwidth(loopback: dict, ratio: float) -> str:
    """The link rate (a multiple of 10 Mbit/s) at which all-reducing the gradients (each
    rank sends and receives them once, 2 ranks) takes ``ratio`` times "compute only"."""
    seconds = loopback["ms"]["compute only"] / 1e3 * ratio
    mbit = loopback["gradient_mb"] * 8 / seconds
    return f"{max(10, min(5000, round(mbit / 10) * 10))}mbit"


def link_ms(result: dict) -> float:
    """The least time the gradients' all-reduce takes on a shaped run's link: each of the
    2 ranks sends (and receives) all of them once."""
    import ddp_lab
    return result["gradient_mb"] * 8e6 / ddp_lab.Network(result["bandwidth"]).bits_per_s * 1e3


def gains(result: dict) -> dict:
    """The ratios each timed lesson is about: worst cap / best cap and no overlap / best
    cap; no hook / each hook."""
    ms, found = result["ms"], {}
    if "overlap" in result["lessons"]:
        best = min(ms[c] for c in result["caps"])
        found["buckets"] = max(ms[c] for c in result["caps"]) / best
        found["overlap"] = ms["no overlap"] / best
    if "compression" in result["lessons"]:
        found.update({hook: ms[HOOK_CAP] / ms[hook] for hook in ("fp16 hook", "PowerSGD hook")})
    return found


def speedups(results: dict) -> dict:
    """``gains`` on loopback and on the shaped links (each lesson on its own link)."""
    return {"loopback": gains(results["loopback"]),
            "shaped": {k: v for lesson in LESSONS for k, v in gains(results[lesson]).items()}}


def column_name(results: dict, name: str) -> str:
    """A table column's heading: the network, and a shaped run's link rate."""
    return name if name == "loopback" else f"{name} {results[name]['bandwidth']}"


def format_table(results: dict) -> str:
    """Milliseconds per step of each setting on each network, then the speedups."""
    names = list(results)
    lines = [f"{'setting':>16} " + " ".join(f"{column_name(results, n):>22}" for n in names)]
    for s in results["loopback"]["ms"]:
        cells = [results[n]["ms"].get(s) for n in names]
        label = s if isinstance(s, str) else f"cap {cap_label(s)}"
        lines.append(f"{label:>16} " + " ".join(f"{c:>19.1f} ms" if c else f"{'-':>22}"
                                                for c in cells))
    lines.append("speedups (worst cap / best cap, no overlap / best cap, no hook / hook):")
    for where, found in speedups(results).items():
        lines.append(f"{where:>16} " + ", ".join(f"{k} {v:.2f}x" for k, v in found.items()))
    return "\n".join(lines)
