"""Notebook 06: what a DDP training step costs, and how throughput scales with ranks.

Weak scaling, as data-parallel jobs are run: every rank keeps its batch, so N ranks process
N times the samples per step, and the ideal is N times the samples per second. Each step is
timed twice: as DDP runs it (backward all-reduces the gradients) and inside ``no_sync()``
(the same compute, no communication), so the gap is what synchronization costs.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

from ddp_lab.course.models import DigitsCNN


@dataclass(frozen=True)
class StepConfig:
    """One thread per rank keeps ranks from competing for a core inside one process:
    on 2 cores, 2 ranks x 1 thread is the most the machine can give."""

    per_rank_batch: int = 32
    image_size: int = 8  # 8: the digits; 28: MNIST-sized, more compute per sample
    steps: int = 15
    warmup: int = 3
    threads: int = 1


def step_throughput(config: StepConfig = StepConfig()) -> dict:
    """On each rank: median seconds per step with and without gradient sync; returns the
    job's samples/s (slowest rank decides: every step waits for it in the all-reduce)."""
    previous = torch.get_num_threads()
    torch.set_num_threads(config.threads)
    try:
        model = DDP(DigitsCNN())
        optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
        images = torch.rand(config.per_rank_batch, 1, config.image_size, config.image_size)
        labels = torch.randint(0, 10, (config.per_rank_batch,))
        synced, local = _time_steps(model, optimizer, images, labels, config)
    finally:
        torch.set_num_threads(previous)
    slowest = _slowest(synced, local)
    world = dist.get_world_size()
    return {"world_size": world, "step_s": slowest[0], "compute_s": slowest[1],
            "samples_per_s": world * config.per_rank_batch / slowest[0]}


def step_flops(config: StepConfig = StepConfig()) -> dict:
    """FLOPs of one training step (forward, backward, SGD) of one rank's batch, counted by
    ``torch.utils.flop_counter.FlopCounterMode`` in this process: a figure load cannot move,
    unlike the timings. Returns the step's and the per-sample FLOPs."""
    from torch.utils.flop_counter import FlopCounterMode

    model = DigitsCNN()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    images = torch.rand(config.per_rank_batch, 1, config.image_size, config.image_size)
    labels = torch.randint(0, 10, (config.per_rank_batch,))
    with FlopCounterMode(display=False) as counter:
        optimizer.zero_grad()
        F.cross_entropy(model(images), labels).backward()
        optimizer.step()
    flops = counter.get_total_flops()
    return {"step_flops": flops, "sample_flops": flops / config.per_rank_batch}


def _time_steps(model, optimizer, images, labels, config) -> tuple[float, float]:
    """Median seconds of a synced and of a ``no_sync`` step, alternated so that load from
    elsewhere on the machine hits both kinds alike."""
    times = {True: [], False: []}
    for step in range(config.warmup + config.steps):
        for sync in (True, False):
            dist.barrier()  # all ranks start together, as in a loop's steady state
            began = time.perf_counter()
            _step(model, optimizer, images, labels, sync)
            if step >= config.warmup:
                times[sync].append(time.perf_counter() - began)
    return statistics.median(times[True]), statistics.median(times[False])


def _step(model, optimizer, images, labels, sync: bool) -> None:
    optimizer.zero_grad()
    if sync:
        F.cross_entropy(model(images), labels).backward()  # all-reduces during backward
    else:
        with model.no_sync():
            F.cross_entropy(model(images), labels).backward()
    optimizer.step()


def _slowest(*seconds: float) -> list[float]:
    tensor = torch.tensor(seconds, dtype=torch.float64)
    dist.all_reduce(tensor, op=dist.ReduceOp.MAX)
    return tensor.tolist()


def scaling_table(results: dict) -> list[dict]:
    """Rows of world size, samples/s, speed-up and efficiency against the 1-rank run, with
    the step's compute (its ``no_sync`` time) and the share of the step spent syncing."""
    base = results[1]["samples_per_s"]
    return [{"world_size": n, "samples_per_s": r["samples_per_s"],
             "speedup": r["samples_per_s"] / base,
             "efficiency": r["samples_per_s"] / base / n,
             "compute_s": r["compute_s"],
             "sync_share": 1 - r["compute_s"] / r["step_s"]}
            for n, r in sorted(results.items())]
