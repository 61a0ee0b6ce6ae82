"""The training steps notebook 07 times against each other, written once: a DDP step (a
bucket cap, optionally a communication hook), and forward and backward without DDP followed
by one all-reduce of every gradient (no overlap) or by nothing (the computation alone).

The bucket sweep (``bucket_sweep``) and the network lessons (``network_costs``) time these
very steps; the overlap timeline (``overlap``) records the same two ways step by step.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

from ddp_lab.course.models import MLPConfig, make_mlp


def all_reduce_after_backward(model: nn.Module, flat: torch.Tensor | None = None) -> torch.Tensor:
    """No-overlap data parallelism by hand: once backward is over, average every gradient
    across ranks with ONE all-reduce of all of them flattened. Returns the flat buffer:
    pass it back next step to reuse it, as DDP reuses its buckets (a fresh tensor of all
    the gradients every step costs page faults that would be blamed on the overlap)."""
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    flat = torch.cat([g.reshape(-1) for g in grads], out=flat)
    dist.all_reduce(flat)
    offset, world = 0, dist.get_world_size()
    for g in grads:  # divide while copying back: one pass over the memory, like DDP's
        torch.div(flat[offset:offset + g.numel()].view_as(g), world, out=g)
        offset += g.numel()
    return flat


def ddp_step(model: MLPConfig, x: torch.Tensor, cap, hook=None):
    """``(ddp, step)``: DDP over the seeded MLP with ``bucket_cap_mb=cap`` and, if given,
    ``hook`` = (state, hook) registered; ``step()`` runs forward and backward on ``x``
    (backward returns once DDP has waited for every bucket)."""
    ddp = DDP(make_mlp(model), bucket_cap_mb=cap)
    if hook is not None:
        ddp.register_comm_hook(*hook)
    return ddp, lambda: ddp(x).square().mean().backward()


def plain_step(model: MLPConfig, x: torch.Tensor, communicate: bool):
    """Forward and backward without DDP; then all gradients in one all-reduce (no overlap),
    or nothing (the computation alone)."""
    mlp = make_mlp(model)
    buffer = [None]  # the flat all-reduce buffer, allocated once

    def step():
        mlp(x).square().mean().backward()
        if communicate:
            buffer[0] = all_reduce_after_backward(mlp, buffer[0])
    return step
