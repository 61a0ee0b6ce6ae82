"""Step times that a loaded machine cannot fool easily, for the chapters that compare
settings (07's buckets and hooks, 10's FSDP on a slow link).

Each timed step starts on every rank after a barrier and counts as long as its slowest
rank took (a collective step is as slow as its slowest participant). Settings take turns
step by step, so a burst of load from elsewhere hits them all alike instead of one.
"""

from __future__ import annotations

import time

import torch
import torch.distributed as dist


def slowest_rank_seconds(step) -> float:
    """Run ``step`` once on every rank, started together; the slowest rank's seconds."""
    dist.barrier()
    start = time.perf_counter()
    step()
    elapsed = torch.tensor([time.perf_counter() - start], dtype=torch.float64)
    dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)
    return elapsed.item()


def time_in_turns(steps: dict, warmup: int, iterations: int) -> dict:
    """{name: [slowest rank's seconds per timed step]}: the steps take turns, one step of
    each per round, so a burst of load from elsewhere hits them all alike."""
    times = {name: [] for name in steps}
    for round_ in range(warmup + iterations):
        for name, step in steps.items():
            seconds = slowest_rank_seconds(step)
            if round_ >= warmup:
                times[name].append(seconds)
    return times
