"""The task every demo of notebook 15 trains: a seeded regression (inputs and the outputs of
a random tanh 'teacher'), the same tensors in every process, each rank slicing its rows.
Notebook 07's workload, restated here because chapters do not import each other."""

from __future__ import annotations

import torch
import torch.distributed as dist

from ddp_lab.course.models import MLPConfig


def regression_data(config: MLPConfig, samples: int, seed: int = 1):
    """``samples`` rows of inputs and their targets, from ``seed`` alone."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(samples, config.inputs, generator=gen)
    teacher = torch.randn(config.inputs, config.outputs, generator=gen) / config.inputs ** 0.5
    return x, torch.tanh(x @ teacher * 2)


def rank_slice(tensor: torch.Tensor, step: int, per_rank: int) -> torch.Tensor:
    """This rank's ``per_rank`` rows of step ``step``'s global batch (rank-major)."""
    rank, world = dist.get_rank(), dist.get_world_size()
    start = (step * world + rank) * per_rank
    return tensor[start:start + per_rank]
