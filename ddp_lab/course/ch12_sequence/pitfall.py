"""A differentiable all-gather that returns wrong gradients (notebook 12).

The obvious way to give every rank all of K is ``torch.distributed.nn.functional.all_gather``
(differentiable: its backward is an all-to-all that sends each piece's gradient home and
sums them). ``scaled_dot_product_attention``'s CPU backward hands it K's gradient in a
transposed layout (not contiguous). The sends are right (``_AlltoAll.forward`` makes them
contiguous, ``T/distributed/nn/functional.py:464``), but the receive buffers are
``torch.empty_like`` of those gradients (``:420``), transposed too, and gloo's ``scatter``
(``:471``) fills them as flat memory: the pieces that arrive are read in the wrong order,
with no error (pytorch/pytorch#192920). A
one-line autograd function that makes the gradient contiguous first fixes it. Every
differentiable collective deserves this check against one process.
"""

from __future__ import annotations

import warnings

import torch
import torch.distributed as dist
import torch.nn.functional as F

from ddp_lab.course.ch12_sequence.attention import AttentionConfig, inputs, shard

SMALL = AttentionConfig(batch=1, heads=2, seq=16, head_dim=8)


class _ContiguousGrad(torch.autograd.Function):
    """Identity forward; backward hands on a contiguous copy of the gradient."""

    @staticmethod
    def forward(ctx, x):
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        return grad.contiguous()


def _gathered_k_attention(fix: bool, config: AttentionConfig) -> dict:
    import torch.distributed.nn.functional as differentiable
    q, k, v, upstream = (shard(t) for t in inputs(config))
    _, full_k, full_v, _ = inputs(config)
    k = k.requires_grad_()
    with warnings.catch_warnings():  # "deprecated, use ..._functional_collectives": still shipped
        warnings.simplefilter("ignore", FutureWarning)
        pieces = differentiable.all_gather(k)
    strides = []
    if fix:
        pieces = [_ContiguousGrad.apply(p) for p in pieces]
    pieces = [_record_stride(p, strides) for p in pieces]
    out = F.scaled_dot_product_attention(q, torch.cat(pieces, dim=-2), full_v)
    (out * upstream).sum().backward()
    return {"k_grad": k.grad, "grad_strides": strides}


class _Stride(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, box):
        ctx.box = box
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        ctx.box.append((tuple(grad.stride()), grad.is_contiguous()))
        return grad, None


def _record_stride(t, box):
    return _Stride.apply(t, box)


def reference_k_grad(config: AttentionConfig = SMALL) -> torch.Tensor:
    """dK of the whole sequence in one process: each rank's queries against all keys."""
    q, k, v, upstream = inputs(config)
    k = k.requires_grad_()
    (F.scaled_dot_product_attention(q, k, v) * upstream).sum().backward()
    return k.grad


def compare(config: AttentionConfig = SMALL) -> dict:
    """This rank's dK shard through the plain differentiable all-gather and through the
    fixed one."""
    return {"plain": _gathered_k_attention(False, config),
            "contiguous": _gathered_k_attention(True, config), "rank": dist.get_rank()}
