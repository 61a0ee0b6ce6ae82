"""Step time against ``bucket_cap_mb`` (notebook 07, ``ddp-lab bench buckets``).

Li et al. (VLDB 2020, "PyTorch Distributed: Experiences on Accelerating Data Parallel
Training") measured DDP's iteration time against bucket size: tiny buckets pay a
collective's fixed cost once per bucket, one giant bucket cannot start before backward
ends, so nothing overlaps; the best lies in between. Here the same sweep on CPU/gloo,
with three references: backward alone (no communication), one all-reduce of all the
gradients alone, and all-reduce after backward (no overlap).

Timing: warm-up steps first (they also rebuild the buckets), a barrier before each timed
step, the slowest rank's time per step, the median over steps. Configurations take turns
step by step, so a burst of load from elsewhere hits all of them alike.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

import torch
import torch.distributed as dist

from ddp_lab.course.ch07_inside_ddp.overlap import TIMELINE_MODEL
from ddp_lab.course.ch07_inside_ddp.steps import ddp_step, plain_step
from ddp_lab.course.models import MLPConfig
from ddp_lab.course.timing import time_in_turns

DEFAULT_CAP = None  # DDP's default: 25 MiB buckets after a first one of 1 MiB


@dataclass(frozen=True)
class SweepConfig:
    """``caps``: the ``bucket_cap_mb`` values. 0.001 (about 1 kB) gives every tensor of
    1 kB or more its own bucket, 1000 puts everything in one, None is DDP's default, which
    is not the same as an explicit 25: only the default gets the small first bucket.
    ``batch``: samples per rank per step. The defaults are the notebook's short sweep
    on the timeline's model (6 layers of 1024 x 1024, 25 MB of gradients)."""

    caps: tuple = (0.001, 1, 8, None, 1000)
    model: MLPConfig = TIMELINE_MODEL
    batch: int = 32
    warmup: int = 2
    iterations: int = 3


def _all_reduce_only(config: SweepConfig):
    flat = torch.zeros(config.model.parameters)
    return lambda: dist.all_reduce(flat)


def time_buckets(config: SweepConfig = SweepConfig()) -> dict:
    """On each rank: {"ms": {name: median ms}, "times": {name: [s per step]}, "buckets":
    {cap: number of buckets after the rebuild}}. Names: each cap (None: the default), then
    "no overlap", "backward only", "all-reduce only"."""
    x = torch.randn(config.batch, config.model.inputs,
                    generator=torch.Generator().manual_seed(dist.get_rank()))
    steps, models = {}, {}
    for cap in config.caps:
        models[cap], steps[cap] = ddp_step(config.model, x, cap)
    steps["no overlap"] = plain_step(config.model, x, communicate=True)
    steps["backward only"] = plain_step(config.model, x, communicate=False)
    steps["all-reduce only"] = _all_reduce_only(config)
    times = time_in_turns(steps, config.warmup, config.iterations)
    return {"ms": {n: statistics.median(t) * 1e3 for n, t in times.items()}, "times": times,
            "buckets": {cap: bucket_count(m) for cap, m in models.items()},
            "caps": list(config.caps), "world_size": dist.get_world_size(),
            "gradient_mb": config.model.parameters * 4 / 1e6}


def bucket_count(ddp) -> int:
    """The buckets DDP uses from its second iteration on (it rebuilds them after the first,
    in the order the gradients arrived)."""
    return len(ddp._get_ddp_logging_data()["rebuilt_bucket_sizes"].split(","))


def cap_label(cap) -> str:
    return "default (25)" if cap is None else f"{cap:g}"


def format_sweep(result: dict) -> str:
    """The sweep as a table: cap, ms per step, buckets, ratio to DDP's default."""
    ms = result["ms"]
    default = ms.get(DEFAULT_CAP)
    lines = [f"{result['world_size']} ranks, {result['gradient_mb']:.1f} MB of gradients "
             "per step; median of the slowest rank's step time",
             f"{'bucket_cap_mb':>15} {'ms/step':>9} {'buckets':>8} {'vs default':>11}"]
    rows = [(cap_label(cap), ms[cap], result["buckets"][cap]) for cap in result["caps"]]
    rows += [(name, ms[name], "") for name in ("no overlap", "backward only", "all-reduce only")]
    for label, value, buckets in rows:
        ratio = f"{value / default:.2f}x" if default else "-"
        lines.append(f"{label:>15} {value:>9.1f} {buckets:>8} {ratio:>11}")
    return "\n".join(lines)
