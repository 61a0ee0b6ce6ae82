"""Ulysses sequence parallelism (DeepSpeed-Ulysses, https://arxiv.org/abs/2309.14509):
attention over a sequence split across ranks, by trading the split for one over heads.

Attention mixes positions but never heads. So one all-to-all turns "every head, my
positions" into "my heads, every position"; each rank runs ordinary attention on whole
sequences of its heads; a second all-to-all turns the output back into "every head, my
positions". Heads must divide by the number of ranks (12 heads do not go on 8); with
grouped-query attention it is the K/V heads that split, and under tensor parallelism the
heads left on a rank. The all-to-alls here block; they could be issued asynchronously and
overlapped with other heads' or layers' work.

An all-to-all's backward is the inverse all-to-all of the gradient. The gradient is made
contiguous first: autograd may hand a function a strided gradient, and gloo fills or reads
a non-contiguous buffer as flat memory, so the wrong numbers would arrive (notebook 12 shows this
happening to ``torch.distributed.nn.functional.all_gather`` on gloo).
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F

from ddp_lab.scratch.ring_attention import gather_shards


def _exchange(x: torch.Tensor, group) -> torch.Tensor:
    """all_to_all_single along dim 0: block j goes to rank j, block j comes from rank j."""
    x = x.contiguous()
    out = torch.empty_like(x)  # like a contiguous x: empty_like keeps a view's strides
    dist.all_to_all_single(out, x, group=group)
    return out


def seq_to_heads(x: torch.Tensor, group=None) -> torch.Tensor:
    """(batch, heads, seq/n, dim) on every rank -> (batch, heads/n, seq, dim): this rank's
    heads over the whole sequence (positions in rank order). Not differentiable: see
    :func:`ulysses_attention`."""
    world = dist.get_world_size(group)
    b, h, s, d = x.shape
    if h % world:
        raise ValueError(f"{h} heads do not split over {world} ranks: Ulysses needs heads "
                         f"divisible by the number of ranks")
    blocks = x.reshape(b, world, h // world, s, d).transpose(0, 1)  # block j: head group j
    got = _exchange(blocks, group)                                   # got[j]: rank j's positions
    return got.permute(1, 2, 0, 3, 4).reshape(b, h // world, world * s, d)


def heads_to_seq(x: torch.Tensor, group=None) -> torch.Tensor:
    """The inverse: (batch, heads/n, seq, dim) -> (batch, heads, seq/n, dim)."""
    world = dist.get_world_size(group)
    b, h, s, d = x.shape
    blocks = x.reshape(b, h, world, s // world, d).permute(2, 0, 1, 3, 4)  # block j: rank j's positions
    got = _exchange(blocks, group)                                         # got[j]: head group j
    return got.transpose(0, 1).reshape(b, h * world, s // world, d)


class _Swap(torch.autograd.Function):
    """seq_to_heads (``to_heads``) or heads_to_seq; backward: the other one, of the gradient."""

    @staticmethod
    def forward(ctx, x, group, to_heads: bool):
        ctx.group, ctx.to_heads = group, to_heads
        return (seq_to_heads if to_heads else heads_to_seq)(x, group)

    @staticmethod
    def backward(ctx, grad):
        back = heads_to_seq if ctx.to_heads else seq_to_heads
        return back(grad.contiguous(), ctx.group), None, None


def ulysses_attention(q, k, v, causal: bool = False, group=None):
    """Softmax attention over the whole sequence from this rank's contiguous shard of it:
    q, k, v (batch, heads, seq_local, head_dim), shards in rank order; returns this rank's
    output rows. Differentiable; 4 all-to-alls forward (q, k, v in, the output back), 4 in
    backward.

    Before the first all-to-all, one all-gather of the shapes and dtypes raises on every
    rank unless every rank holds the same shape and dtype and the heads divide by the ranks:
    ``all_to_all_single`` without split sizes cuts every tensor into n equal blocks, and on
    gloo blocks of different sizes abort a process instead of raising."""
    world = dist.get_world_size(group)
    if world > 1:
        shards = gather_shards("ulysses_attention", q, k, v, group)
        if len(set(shards)) > 1:
            raise ValueError(
                f"ulysses_attention needs the same shard shape and dtype on every rank, got "
                f"{shards} (rank order): split the sequence evenly (a length divisible by "
                f"{world}) and give every rank one dtype")
        if q.shape[1] % world:
            raise ValueError(f"{q.shape[1]} heads do not split over {world} ranks: Ulysses needs "
                             f"heads divisible by the number of ranks")
    q, k, v = (_Swap.apply(t, group, True) for t in (q, k, v))
    out = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
    return _Swap.apply(out, group, False)
