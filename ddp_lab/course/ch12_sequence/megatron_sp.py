"""Megatron's sequence parallelism (Korthikanti et al., https://arxiv.org/abs/2205.05198):
notebook 11's tensor-parallel MLP, with the activations between the blocks sharded along
the sequence.

With tensor parallelism alone, the layers between two tensor-parallel blocks (LayerNorm,
dropout, the residual) see the whole sequence on every rank: the same activations n times.
Sequence parallelism keeps them sharded by positions: an all-gather along the sequence
enters the column-parallel layer (its backward: a reduce-scatter), and the row-parallel
layer ends with a reduce-scatter along the sequence instead of an all-reduce (its backward:
an all-gather). An all-reduce is a reduce-scatter plus an all-gather, so the bytes stay the
same; the activations between the blocks take 1/n of the memory.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

from ddp_lab import scratch
from ddp_lab.course.collective_trace import CollectiveTrace


@dataclass(frozen=True)
class BlockConfig:
    seq: int = 16
    dim: int = 8
    hidden: int = 32
    seed: int = 0


def make_block(config: BlockConfig) -> nn.ModuleDict:
    torch.manual_seed(config.seed)
    return nn.ModuleDict({"norm": nn.LayerNorm(config.dim),
                          "up": nn.Linear(config.dim, config.hidden),
                          "down": nn.Linear(config.hidden, config.dim)})


def make_input(config: BlockConfig) -> torch.Tensor:
    return torch.randn(config.seq, config.dim, generator=torch.Generator().manual_seed(1))


def unsharded(config: BlockConfig = BlockConfig()) -> dict:
    block, x = make_block(config), make_input(config).requires_grad_()
    out = block["down"](F.gelu(block["up"](block["norm"](x))))
    out.square().sum().backward()
    return {"out": out.detach(), "x_grad": x.grad, "norm_grad": block["norm"].weight.grad}


class _GatherSeq(torch.autograd.Function):
    """All-gather along the sequence (dim 0); backward: reduce-scatter of the gradient."""

    @staticmethod
    def forward(ctx, x):
        out = x.new_empty((x.shape[0] * dist.get_world_size(), *x.shape[1:]))
        dist.all_gather_single(out, x.contiguous())
        return out

    @staticmethod
    def backward(ctx, grad):
        return _reduce_scatter(grad)


class _ReduceScatterSeq(torch.autograd.Function):
    """Reduce-scatter along the sequence; backward: all-gather of the gradient."""

    @staticmethod
    def forward(ctx, x):
        return _reduce_scatter(x)

    @staticmethod
    def backward(ctx, grad):
        return _GatherSeq.forward(None, grad)


def _reduce_scatter(x):
    out = x.new_empty((x.shape[0] // dist.get_world_size(), *x.shape[1:]))
    dist.reduce_scatter_single(out, x.contiguous())
    return out


def _split(config: BlockConfig):
    full = make_block(config)
    return (full["norm"], scratch.ColumnParallelLinear(full["up"]),
            scratch.RowParallelLinear(full["down"]))


def tensor_parallel(config: BlockConfig = BlockConfig()) -> dict:
    """Notebook 11's layers: LayerNorm on the whole sequence on every rank."""
    norm, up, down = _split(config)
    x = make_input(config).requires_grad_()
    return _traced(lambda: down(F.gelu(up(norm(x)))), x, norm, (norm, up, down))


def sequence_parallel(config: BlockConfig = BlockConfig()) -> dict:
    """LayerNorm on this rank's positions; all-gather in, reduce-scatter out."""
    norm, up, down = _split(config)
    x = make_input(config).chunk(dist.get_world_size())[dist.get_rank()].clone().requires_grad_()

    def forward():
        hidden = F.gelu(F.linear(_GatherSeq.apply(norm(x)), up.weight, up.bias))
        return _ReduceScatterSeq.apply(F.linear(hidden, down.weight)) + down.bias
    result = _traced(forward, x, norm, (norm, up, down))
    dist.all_reduce(result["norm_grad"])  # each rank saw its positions only
    return result


def _traced(forward, x, norm, modules=()) -> dict:
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t, lambda t: t):
        with CollectiveTrace(dist.get_world_size()) as fwd:
            out = forward()
    with CollectiveTrace(dist.get_world_size()) as bwd:
        out.square().sum().backward()
    return {"out": out.detach(), "x_grad": x.grad, "norm_grad": norm.weight.grad.clone(),
            "norm_input_bytes": x.numel() * x.element_size(),
            "saved": _saved_activations(saved, modules),
            "forward": [(c.name, c.bytes_per_rank) for c in fwd.calls],
            "backward": [(c.name, c.bytes_per_rank) for c in bwd.calls]}


def _saved_activations(saved, modules) -> list[tuple[tuple[int, ...], int]]:
    """The shapes and bytes of the activations autograd kept for backward (parameters left
    out; a tensor saved twice counted once)."""
    weights = {p.untyped_storage().data_ptr() for m in modules for p in m.parameters()}
    seen, result = set(), []
    for t in saved:
        if t.untyped_storage().data_ptr() in weights:
            continue
        key = (t.untyped_storage().data_ptr(), t.storage_offset(), tuple(t.shape))
        if key not in seen:
            seen.add(key)
            result.append((tuple(t.shape), t.numel() * t.element_size()))
    return result


def both(config: BlockConfig = BlockConfig()) -> dict:
    return {"tensor parallel": tensor_parallel(config), "sequence parallel": sequence_parallel(config)}
