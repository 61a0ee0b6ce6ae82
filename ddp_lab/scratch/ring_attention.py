"""Ring attention from point-to-point messages (Liu et al., https://arxiv.org/abs/2310.01889):
attention over a sequence split across ranks, without any rank ever holding all of it.

Each rank keeps its shard of the queries and passes its keys and values around a ring: in
step ``i`` a rank attends to the K/V block of rank ``rank - i`` while, at the same time
(``isend``/``irecv``), that block travels on to the next rank and the following one arrives.
The blocks' results are combined by the **online softmax** of FlashAttention
(https://arxiv.org/abs/2205.14135): per query row a running maximum ``m``, a running sum
``l`` of ``exp(score - m)`` and a running numerator ``acc``; a new block rescales what was
there by ``exp(m_old - m_new)``. The result equals softmax over the whole row.

Backward rings K/V around again; the gradients of each K/V block travel with it, every rank
adding its queries' share, and arrive home after one more hop.

A shard is a list of chunks of consecutive positions. ``"contiguous"``: rank r holds
positions ``[r S, (r+1) S)``. ``"zigzag"``: chunk r and chunk 2n-1-r of 2n chunks, so every
rank has as much causal work as the others (https://github.com/zhuzilin/ring-flash-attention).
"""

from __future__ import annotations

import math

import torch
import torch.distributed as dist

LAYOUTS = ("contiguous", "zigzag")


def chunks(layout: str, rank: int, world: int, seq_local: int) -> list[tuple[int, int, int]]:
    """Rank ``rank``'s positions as (offset in the shard, first global position, length)."""
    if layout == "contiguous":
        return [(0, rank * seq_local, seq_local)]
    if layout == "zigzag":
        if seq_local % 2:
            raise ValueError(f"a zig-zag shard holds two equal chunks: seq_local={seq_local} is odd")
        c = seq_local // 2
        return [(0, rank * c, c), (c, (2 * world - 1 - rank) * c, c)]
    raise ValueError(f"layout must be one of {LAYOUTS}, not {layout!r}")


def pair_kind(q_chunk, k_chunk, causal: bool) -> str:
    """How a chunk of queries meets a chunk of keys: "full", "masked" (the diagonal) or
    "skip" (every key comes after every query)."""
    if not causal:
        return "full"
    (_, q0, qn), (_, k0, kn) = q_chunk, k_chunk
    if k0 >= q0 + qn:
        return "skip"
    return "full" if k0 + kn - 1 <= q0 else "masked"


def online_softmax_step(acc, m, l, scores, v):
    """Fold one block of ``scores`` (..., rows, keys; -inf where masked) and its values ``v``
    into the running numerator ``acc``, maximum ``m`` and sum ``l`` of each row."""
    m_new = torch.maximum(m, scores.amax(dim=-1))
    p = torch.exp(scores - m_new.unsqueeze(-1))
    correction = torch.exp(m - m_new)  # 0 on the first block (m = -inf)
    l_new = l * correction + p.sum(dim=-1)
    acc_new = acc * correction.unsqueeze(-1) + p @ v
    return acc_new, m_new, l_new


def _scores(q, k, q_chunk, k_chunk, kind: str, scale: float):
    s = (q @ k.transpose(-2, -1)) * scale
    if kind == "masked":
        q_pos = torch.arange(q_chunk[1], q_chunk[1] + q_chunk[2]).unsqueeze(-1)
        k_pos = torch.arange(k_chunk[1], k_chunk[1] + k_chunk[2])
        s = s.masked_fill(k_pos > q_pos, float("-inf"))
    return s


def _block_pairs(layout, rank, source, world, seq_local, causal):
    """The (query chunk, key chunk, kind) pairs with work in them, rank's queries against
    source's keys."""
    mine, theirs = chunks(layout, rank, world, seq_local), chunks(layout, source, world, seq_local)
    pairs = [(qc, kc, pair_kind(qc, kc, causal)) for qc in mine for kc in theirs]
    return [p for p in pairs if p[2] != "skip"]


def _rows(t, chunk):
    return t[..., chunk[0]:chunk[0] + chunk[2], :]


def _shift(t, group, rank, world):
    """Start sending ``t`` to the next rank and receiving the previous rank's into a new
    buffer; returns (buffer, works). Nothing to do on one rank."""
    if world == 1:
        return t, []
    incoming = torch.empty_like(t)
    ops = [dist.P2POp(dist.isend, t, group=group, group_peer=(rank + 1) % world),
           dist.P2POp(dist.irecv, incoming, group=group, group_peer=(rank - 1) % world)]
    return incoming, dist.batch_isend_irecv(ops)


def _wait(works):
    for work in works:
        work.wait()


def _forward(q, k, v, causal, group, layout):
    rank, world = dist.get_rank(group), dist.get_world_size(group)
    seq_local, scale = q.shape[-2], 1.0 / math.sqrt(q.shape[-1])
    acc = torch.zeros_like(q)
    m = torch.full(q.shape[:-1], float("-inf"), dtype=q.dtype)
    l = torch.zeros(q.shape[:-1], dtype=q.dtype)
    kv = torch.stack((k, v)).contiguous()  # one message per step
    for step in range(world):
        source = (rank - step) % world
        incoming, works = _shift(kv, group, rank, world) if step < world - 1 else (kv, [])
        for qc, kc, kind in _block_pairs(layout, rank, source, world, seq_local, causal):
            s = _scores(_rows(q, qc), _rows(kv[0], kc), qc, kc, kind, scale)
            rows = slice(qc[0], qc[0] + qc[2])
            acc[..., rows, :], m[..., rows], l[..., rows] = online_softmax_step(
                acc[..., rows, :], m[..., rows], l[..., rows], s, _rows(kv[1], kc))
        _wait(works)  # the next block has arrived while this one was computed
        kv = incoming
    return acc / l.unsqueeze(-1), m + torch.log(l)


def _backward(q, k, v, out, lse, grad_out, causal, group, layout):
    rank, world = dist.get_rank(group), dist.get_world_size(group)
    seq_local, scale = q.shape[-2], 1.0 / math.sqrt(q.shape[-1])
    delta = (grad_out * out).sum(dim=-1, keepdim=True)
    grad_q = torch.zeros_like(q)
    kv = torch.stack((k, v)).contiguous()
    grad_kv = torch.zeros_like(kv)  # the gradients of the block in hand, travelling with it
    for step in range(world):
        source = (rank - step) % world
        incoming, works = _shift(kv, group, rank, world) if step < world - 1 else (kv, [])
        for qc, kc, kind in _block_pairs(layout, rank, source, world, seq_local, causal):
            k_c, v_c, q_c, go = _rows(kv[0], kc), _rows(kv[1], kc), _rows(q, qc), _rows(grad_out, qc)
            p = torch.exp(_scores(q_c, k_c, qc, kc, kind, scale) - _rows(lse.unsqueeze(-1), qc))
            ds = p * (go @ v_c.transpose(-2, -1) - _rows(delta, qc))
            _rows(grad_q, qc).add_(ds @ k_c * scale)
            _rows(grad_kv[0], kc).add_(ds.transpose(-2, -1) @ q_c * scale)
            _rows(grad_kv[1], kc).add_(p.transpose(-2, -1) @ go)
        _wait(works)
        kv = incoming
        grad_kv, grad_works = _shift(grad_kv, group, rank, world)  # one hop on: home after the last
        _wait(grad_works)
    return grad_q, grad_kv[0], grad_kv[1]


class _RingAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, causal, group, layout):
        out, lse = _forward(q.detach(), k.detach(), v.detach(), causal, group, layout)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.options = (causal, group, layout)
        return out

    @staticmethod
    def backward(ctx, grad_out):
        q, k, v, out, lse = ctx.saved_tensors
        grads = _backward(q, k, v, out, lse, grad_out.contiguous(), *ctx.options)
        return (*grads, None, None, None)


def ring_attention(q, k, v, causal: bool = False, group=None, *, layout: str = "contiguous"):
    """Softmax attention over the whole sequence, from this rank's shard of it.

    ``q``, ``k``, ``v``: (batch, heads, seq_local, head_dim), this rank's positions (see
    :func:`chunks`; shards in rank order). Returns this rank's output rows; differentiable,
    with the gradients of full attention (scale 1/sqrt(head_dim), like
    ``scaled_dot_product_attention``)."""
    if layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {LAYOUTS}, not {layout!r}")
    if not (q.shape == k.shape == v.shape):
        raise ValueError(f"q, k and v must have one shape (batch, heads, seq_local, head_dim); "
                         f"got {tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}")
    return _RingAttention.apply(q, k, v, causal, group, layout)


def zigzag_shard(x: torch.Tensor, rank: int, world: int, dim: int = -2) -> torch.Tensor:
    """Rank ``rank``'s zig-zag shard of a full sequence: chunks r and 2n-1-r of 2n."""
    pieces = x.chunk(2 * world, dim=dim)
    return torch.cat((pieces[rank], pieces[2 * world - 1 - rank]), dim=dim)


def zigzag_unshard(shards: list[torch.Tensor], dim: int = -2) -> torch.Tensor:
    """The full sequence back from every rank's zig-zag shard, in rank order."""
    world = len(shards)
    firsts = [s.chunk(2, dim=dim)[0] for s in shards]
    seconds = [s.chunk(2, dim=dim)[1] for s in reversed(shards)]
    return torch.cat(firsts + seconds, dim=dim)
