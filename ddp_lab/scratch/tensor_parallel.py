"""Tensor parallelism from the collectives: Megatron-LM's column- and row-parallel linear
layers (Shoeybi et al., https://arxiv.org/abs/1909.08053, section 3).

An MLP ``Linear(d, h) -> act -> Linear(h, d)`` splits so that only one all-reduce is needed
per direction. The first layer is **column parallel**: each rank holds h/n rows of the
weight (h/n of the h output features), so from the full input it computes its slice of the
hidden activations; the element-wise activation needs nothing from the others. The second
layer is **row parallel**: each rank holds the matching h/n input columns, multiplies its
slice, and the partial outputs are summed by one all-reduce (Megatron's "g"). In backward
the mirror image happens: the input's gradient is a sum of the ranks' contributions, one
all-reduce where the input entered the column-parallel layer (Megatron's "f").
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn as nn


class _CopyToParallel(torch.autograd.Function):
    """f: identity in forward, all-reduce of the gradient in backward."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return x

    @staticmethod
    def backward(ctx, grad):
        grad = grad.contiguous().clone()
        dist.all_reduce(grad, group=ctx.group)
        return grad, None


class _ReduceFromParallel(torch.autograd.Function):
    """g: all-reduce in forward, identity in backward."""

    @staticmethod
    def forward(ctx, partial, group):
        total = partial.clone()
        dist.all_reduce(total, group=group)
        return total

    @staticmethod
    def backward(ctx, grad):
        return grad, None


def _my_slice(t: torch.Tensor, dim: int, group) -> torch.Tensor:
    n, rank = dist.get_world_size(group), dist.get_rank(group)
    if t.shape[dim] % n:
        raise ValueError(f"a dimension of {t.shape[dim]} does not split over {n} ranks; "
                         f"choose layer sizes that divide by the tensor-parallel size")
    return t.detach().chunk(n, dim=dim)[rank].clone()


class ColumnParallelLinear(nn.Module):
    """This rank's slice of ``linear``'s outputs: weight rows (and bias) split over ``group``.
    Takes the full input, returns this rank's slice of the output."""

    def __init__(self, linear: nn.Linear, group=None):
        super().__init__()
        self.group = group
        self.weight = nn.Parameter(_my_slice(linear.weight, 0, group))
        self.bias = nn.Parameter(_my_slice(linear.bias, 0, group)) if linear.bias is not None else None

    def forward(self, x):
        x = _CopyToParallel.apply(x, self.group)
        return nn.functional.linear(x, self.weight, self.bias)


class RowParallelLinear(nn.Module):
    """This rank's slice of ``linear``'s inputs: weight columns split over ``group``. Takes
    this rank's slice of the input, returns the full output (one all-reduce; the bias is
    added once, after it)."""

    def __init__(self, linear: nn.Linear, group=None):
        super().__init__()
        self.group = group
        self.weight = nn.Parameter(_my_slice(linear.weight, 1, group))
        self.bias = nn.Parameter(linear.bias.detach().clone()) if linear.bias is not None else None

    def forward(self, x_slice):
        out = _ReduceFromParallel.apply(nn.functional.linear(x_slice, self.weight), self.group)
        return out + self.bias if self.bias is not None else out
