"""Notebook 09b, part 3: ``nn.DataParallel`` next to DDP, measured where it can be: here.

``DataParallel`` is one process that, on every forward, copies the module to each GPU,
splits the batch, runs the replicas in threads and gathers the outputs on the first GPU.
Without GPUs it does none of that: its constructor keeps ``device_ids`` empty and its
``forward`` calls the module directly (``torch/nn/parallel/data_parallel.py``). So on this
machine it runs exactly as fast as the bare model, on one process, while DDP runs one
process per rank. The GPU costs of DataParallel (replication every step, scatter/gather
through GPU 0, threads under the GIL) need GPUs to measure.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP


@dataclass(frozen=True)
class Workload:
    """An MLP of ``depth`` layers of ``width``, trained on a global batch of ``batch``."""

    width: int = 512
    depth: int = 4
    batch: int = 128
    steps: int = 8


def _model(work: Workload) -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(*[nn.Linear(work.width, work.width) for _ in range(work.depth)])


def _samples_per_second(model: nn.Module, batch: int, work: Workload) -> float:
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    x = torch.randn(batch, work.width)
    model(x).square().mean().backward()  # warm-up step
    start = time.perf_counter()
    for _ in range(work.steps):
        optimizer.zero_grad()
        model(x).square().mean().backward()
        optimizer.step()
    return work.steps * batch / (time.perf_counter() - start)


def one_process(work: Workload = Workload()) -> dict:
    """In this process: samples/s of the bare model and of ``DataParallel(model)``, and
    what DataParallel made of this machine (its ``device_ids``)."""
    bare = _samples_per_second(_model(work), work.batch, work)
    wrapped = nn.DataParallel(_model(work))
    return {"bare model": bare, "DataParallel": _samples_per_second(wrapped, work.batch, work),
            "device_ids": wrapped.device_ids}


def ddp_rank(work: Workload = Workload()) -> float:
    """On each rank: the job's samples/s with DDP, the global batch split over the ranks
    (the slowest rank's time counts)."""
    world = dist.get_world_size()
    per_rank = _samples_per_second(DDP(_model(work)), work.batch // world, work)
    seconds = torch.tensor([work.steps * (work.batch // world) / per_rank])
    dist.all_reduce(seconds, op=dist.ReduceOp.MAX)
    return work.steps * work.batch / seconds.item()
