"""Notebook 10: activation checkpointing, the other memory term, composed with FSDP2.

Sharding removes the copies of parameters, gradients and optimizer state; what backward
keeps of the forward (each layer's input, each ReLU's output) still grows with the batch and
the depth. ``checkpoint_wrapper`` (torch/distributed/algorithms/_checkpoint/
checkpoint_wrapper.py, non-reentrant ``torch.utils.checkpoint`` underneath) keeps only each
wrapped block's input and runs the block's forward again in backward. Wrapped first and
sharded after (``fully_shard`` on the wrapped blocks), the recomputation runs on the
parameters FSDP2 all-gathers for that block's backward anyway.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard

from ddp_lab.course.collective_trace import CollectiveTrace


@dataclass(frozen=True)
class DeepConfig:
    inputs: int = 16
    width: int = 48
    blocks: int = 4
    rows_per_rank: int = 10  # no parameter has 10 rows or columns: activations tell apart
    seed: int = 0


def make_blocks(config: DeepConfig, checkpointed: bool) -> nn.Sequential:
    torch.manual_seed(config.seed)
    blocks = [nn.Sequential(nn.Linear(config.inputs if i == 0 else config.width, config.width),
                            nn.ReLU(), nn.Linear(config.width, config.width), nn.ReLU())
              for i in range(config.blocks)]
    if checkpointed:
        blocks = [checkpoint_wrapper(block) for block in blocks]
    return nn.Sequential(*blocks, nn.Linear(config.width, 1))


def one_step(config: DeepConfig, checkpointed: bool) -> dict:
    """One forward and backward of this rank's rows under FSDP2: bytes of activations saved
    for backward, the collectives of backward, and the full gradients."""
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    model = make_blocks(config, checkpointed)
    for block in list(model)[:-1]:
        fully_shard(block, mesh=mesh)
    fully_shard(model, mesh=mesh)
    x = torch.randn(config.rows_per_rank, config.inputs,
                    generator=torch.Generator().manual_seed(100 + dist.get_rank()))
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: _note(saved, t, config), lambda t: t):
        loss = model(x).square().mean()
    with CollectiveTrace() as backward:
        loss.backward()
    return {"saved_bytes": sum(saved), "backward": backward.family_counts(),
            "grads": {name: p.grad.full_tensor() for name, p in model.named_parameters()}}


def _note(saved: list, tensor: torch.Tensor, config: DeepConfig) -> torch.Tensor:
    if tensor.dim() == 2 and tensor.shape[0] == config.rows_per_rank:  # an activation
        saved.append(tensor.numel() * tensor.element_size())
    return tensor


def with_and_without(config: DeepConfig = DeepConfig()) -> dict:
    return {"plain": one_step(config, False), "checkpointed": one_step(config, True)}
