"""The attention problem of notebook 12 and its one-process reference: q, k, v for a whole
sequence, full attention with ``scaled_dot_product_attention``, and each rank's run of
``scratch.ring_attention`` / ``scratch.ulysses_attention`` on its shard."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn.functional as F

from ddp_lab import scratch
from ddp_lab.scratch.ring_attention import online_softmax_step, zigzag_shard


@dataclass(frozen=True)
class AttentionConfig:
    batch: int = 2
    heads: int = 4
    seq: int = 64      # the whole sequence; every rank holds seq / world of it
    head_dim: int = 16
    seed: int = 0


def inputs(config: AttentionConfig) -> tuple:
    """q, k, v and an upstream gradient for the whole sequence."""
    g = torch.Generator().manual_seed(config.seed)
    shape = (config.batch, config.heads, config.seq, config.head_dim)
    return tuple(torch.randn(shape, generator=g) for _ in range(4))


def full_attention(config: AttentionConfig, causal: bool) -> dict:
    """The reference: attention on the whole sequence in one process, and its gradients."""
    q, k, v, upstream = inputs(config)
    q, k, v = (t.requires_grad_() for t in (q, k, v))
    out = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
    (out * upstream).sum().backward()
    return {"out": out.detach(), "grads": {"q": q.grad, "k": k.grad, "v": v.grad}}


def shard(t: torch.Tensor, layout: str = "contiguous") -> torch.Tensor:
    rank, world = dist.get_rank(), dist.get_world_size()
    if layout == "zigzag":
        return zigzag_shard(t, rank, world).clone()
    if t.shape[-2] % world:
        raise ValueError(f"shard: {t.shape[-2]} positions do not split into {world} equal shards; "
                         f"use a multiple of {world}")
    return t.chunk(world, dim=-2)[rank].clone()


def sharded(how: str, causal: bool, config: AttentionConfig = AttentionConfig(),
            layout: str = "contiguous") -> dict:
    """This rank's output shard and the gradients of its q, k, v shards ("ring" or
    "ulysses"), for the loss of :func:`full_attention`."""
    q, k, v, upstream = (shard(t, layout) for t in inputs(config))
    q, k, v = (t.requires_grad_() for t in (q, k, v))
    if how == "ring":
        out = scratch.ring_attention(q, k, v, causal=causal, layout=layout)
    else:
        out = scratch.ulysses_attention(q, k, v, causal=causal)
    (out * upstream).sum().backward()
    return {"out": out.detach(), "grads": {"q": q.grad, "k": k.grad, "v": v.grad},
            "shape": tuple(q.shape)}


def both_ways(config: AttentionConfig = AttentionConfig()) -> dict:
    return {(how, causal): sharded(how, causal, config)
            for how in ("ring", "ulysses") for causal in (False, True)}


def online_softmax_blocks(scores: torch.Tensor, values: torch.Tensor, blocks: int) -> dict:
    """One row of scores folded block by block with ``online_softmax_step``: the running
    max, sum and output after each block, next to softmax over the whole row."""
    acc = torch.zeros(1, values.shape[-1])
    m, l = torch.full((1,), float("-inf")), torch.zeros(1)
    steps = []
    for s, v in zip(scores.chunk(blocks), values.chunk(blocks)):
        acc, m, l = online_softmax_step(acc, m, l, s.unsqueeze(0), v)
        steps.append({"m": m.item(), "l": l.item(), "out": (acc / l.unsqueeze(-1))[0].clone()})
    return {"steps": steps, "exact": torch.softmax(scores, dim=0) @ values}


def lse_merge(out_a, lse_a, out_b, lse_b):
    """Two attention blocks' outputs over disjoint key sets, each with its log-sum-exp per row,
    merged into attention over both, as torch's ``context_parallel`` merges them
    (``_SDPAMerger``, ``T/distributed/tensor/experimental/_context_parallel/_attention.py:186-187``),
    in float32. The online softmax's rescaling, written on outputs instead of ``(acc, m, l)``:
    the merged output weighs each block by its share ``exp(lse_i - lse)`` of the row's sum."""
    out_a, lse_a, out_b, lse_b = (t.to(torch.float32) for t in (out_a, lse_a, out_b, lse_b))
    out = out_a - torch.sigmoid(lse_b - lse_a).unsqueeze(-1) * (out_a - out_b)
    lse = lse_a - F.logsigmoid(lse_a - lse_b)
    return out, lse


def block_attention(q, k, v):
    """Attention of ``q`` over one block of keys: the output and each row's log-sum-exp."""
    s = q @ k.transpose(-2, -1) / q.shape[-1] ** 0.5
    return torch.softmax(s, dim=-1) @ v, torch.logsumexp(s, dim=-1)


def merge_two_blocks(config: AttentionConfig = AttentionConfig(), split: int = 24) -> dict:
    """Non-causal attention over every key, and the same from two blocks of keys
    (``[0, split)`` and ``[split, S)``) merged by ``lse_merge``."""
    q, k, v, _ = inputs(config)
    a = block_attention(q, k[..., :split, :], v[..., :split, :])
    b = block_attention(q, k[..., split:, :], v[..., split:, :])
    out, lse = lse_merge(*a, *b)
    whole = block_attention(q, k, v)
    return {"merged": out, "merged_lse": lse, "whole": whole[0], "whole_lse": whole[1],
            "sdpa": F.scaled_dot_product_attention(q, k, v)}
