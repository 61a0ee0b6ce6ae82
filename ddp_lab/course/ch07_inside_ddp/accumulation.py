"""Gradient accumulation with ``no_sync()`` (notebook 07).

To train with a batch K times larger than fits, run K micro-batches forward and backward
and step the optimizer once. With DDP every backward would all-reduce, K times per step;
inside ``with ddp.no_sync():`` the Reducer only accumulates gradients locally, so the one
backward outside it all-reduces the sum: the same gradients, 1/K of the communication
(the "skipping synchronization" of Li et al., VLDB 2020).

Dividing each micro-batch's loss by K makes the accumulated gradient the mean over the
K micro-batches, so K micro-batches on each of N ranks equal one batch of all N*K of them
in a single process: ``large_batch_reference`` computes that for the comparison.
"""

from __future__ import annotations

from contextlib import nullcontext

import torch
import torch.nn.functional as F
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from ddp_lab.course.params import flat_params
from ddp_lab.course.ch07_inside_ddp.workload import BucketRecorder, rank_slice, regression_data
from ddp_lab.course.models import MLPConfig, make_mlp

ACCUMULATION_MODEL = MLPConfig(inputs=32, width=128, depth=3, outputs=4)
LR = 0.1


def accumulate(accumulation: int = 4, micro_batch: int = 8, steps: int = 3,
               use_no_sync: bool = True, config: MLPConfig = ACCUMULATION_MODEL) -> dict:
    """On each rank: ``steps`` optimizer steps of ``accumulation`` micro-batches each.
    Returns the final parameters and, per optimizer step, the buckets all-reduced and
    their bytes (recorded by ``BucketRecorder``)."""
    model = make_mlp(config)
    ddp = DDP(model)
    recorder = BucketRecorder(model).register(ddp)
    optimizer = torch.optim.SGD(ddp.parameters(), lr=LR)
    x, y = regression_data(config, steps * dist.get_world_size() * accumulation * micro_batch)
    for step in range(steps):
        recorder.iteration = step
        xs = rank_slice(x, step, accumulation * micro_batch).chunk(accumulation)
        ys = rank_slice(y, step, accumulation * micro_batch).chunk(accumulation)
        for k, (xm, ym) in enumerate(zip(xs, ys)):
            skip = use_no_sync and k < accumulation - 1
            with ddp.no_sync() if skip else nullcontext():
                (F.mse_loss(ddp(xm), ym) / accumulation).backward()
        optimizer.step()
        optimizer.zero_grad()
    return {"weights": flat_params(model),
            "all_reduces": recorder.per_iteration(iterations=steps),
            "bytes": recorder.per_iteration("bytes", iterations=steps)}


def accumulation_pair(accumulation: int = 4, micro_batch: int = 8, steps: int = 3) -> dict:
    """``accumulate`` with ``no_sync`` and without it (all-reduce after every micro-batch)."""
    return {"no_sync": accumulate(accumulation, micro_batch, steps, use_no_sync=True),
            "every micro-batch": accumulate(accumulation, micro_batch, steps, use_no_sync=False)}


def large_batch_reference(world_size: int, accumulation: int = 4, micro_batch: int = 8,
                          steps: int = 3, config: MLPConfig = ACCUMULATION_MODEL) -> torch.Tensor:
    """One process, no DDP: each step on the whole global batch (every rank's micro-batches
    together, world_size * accumulation * micro_batch samples). Final parameters."""
    model = make_mlp(config)
    optimizer = torch.optim.SGD(model.parameters(), lr=LR)
    global_batch = world_size * accumulation * micro_batch
    x, y = regression_data(config, steps * global_batch)
    for step in range(steps):
        rows = slice(step * global_batch, (step + 1) * global_batch)
        F.mse_loss(model(x[rows]), y[rows]).backward()
        optimizer.step()
        optimizer.zero_grad()
    return flat_params(model)


def accumulation_counts(accumulation: int = 4) -> dict:
    """``ddp-lab run no_sync``: all-reduces per optimizer step, with and without no_sync."""
    return {name: r["all_reduces"] for name, r in accumulation_pair(accumulation).items()}
