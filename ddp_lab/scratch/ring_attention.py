"""Ring attention from point-to-point messages (Liu et al., https://arxiv.org/abs/2310.01889):
attention over a sequence split across ranks, without any rank ever holding all of it.

Each rank keeps its shard of the queries and passes its keys and values around a ring: in
step ``i`` a rank attends to the K/V block of rank ``rank - i`` while, at the same time
(``isend``/``irecv``), that block travels on to the next rank and the following one arrives.
The blocks' results are combined by the **online softmax** of FlashAttention
(https://arxiv.org/abs/2205.14135): per query row a running maximum ``m``, a running sum
``l`` of ``exp(score - m)`` and a running numerator ``acc``; a new block rescales what was
there by ``exp(m_old - m_new)``. The result equals softmax over the whole row.

Backward rings K/V around again (n-1 messages); the gradients of each K/V block travel with
it, every rank adding its queries' share, and arrive home after one more hop (n messages): 2n-1
K/V-sized messages per backward against the forward's n-1. Each dK/dV hop is posted after a
block's compute and waited for after the next block's compute, as ring-flash-attention does, so
it too travels while a block is computed.

The running ``acc``, ``m``, ``l``, dQ and the travelling dK/dV are float32 whatever the input
dtype (each block is computed in float32 too), and the results are cast to the input dtype at
the end, as torch's ``context_parallel`` does (``convert_to_f32``): rounding every step's merge
and every hop's sum to bfloat16 would make the ring several times less accurate than
``scaled_dot_product_attention`` in bfloat16. K/V travel in their own dtype; dK/dV in float32.

Every rank must hold the same number of positions: :func:`ring_attention` all-gathers the
shapes once and raises on every rank, before any K/V is sent, if they differ.

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
    into the running numerator ``acc``, maximum ``m`` and sum ``l`` of each row.

    A row whose keys so far are all masked has ``m_new = -inf``; ``exp(-inf - (-inf))`` would
    be NaN, so the exponentials subtract 0 there instead (as FlashAttention's kernels do) and
    the row stays at ``acc = 0, l = 0`` until a visible key arrives."""
    m_new = torch.maximum(m, scores.amax(dim=-1))
    m_safe = torch.where(torch.isinf(m_new), torch.zeros_like(m_new), m_new)
    p = torch.exp(scores - m_safe.unsqueeze(-1))
    correction = torch.exp(m - m_safe)  # 0 on the first block (m = -inf)
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
    f32 = torch.float32  # the running statistics, whatever the input dtype
    acc = torch.zeros(q.shape, dtype=f32)
    m = torch.full(q.shape[:-1], float("-inf"), dtype=f32)
    l = torch.zeros(q.shape[:-1], dtype=f32)
    q32 = q.to(f32)
    kv = torch.stack((k, v)).contiguous()  # one message per step, in the input dtype
    for step in range(world):
        source = (rank - step) % world
        incoming, works = _shift(kv, group, rank, world) if step < world - 1 else (kv, [])
        kv32 = kv.to(f32)
        for qc, kc, kind in _block_pairs(layout, rank, source, world, seq_local, causal):
            s = _scores(_rows(q32, qc), _rows(kv32[0], kc), qc, kc, kind, scale)
            rows = slice(qc[0], qc[0] + qc[2])
            acc[..., rows, :], m[..., rows], l[..., rows] = online_softmax_step(
                acc[..., rows, :], m[..., rows], l[..., rows], s, _rows(kv32[1], kc))
        _wait(works)  # the next block has arrived while this one was computed
        kv = incoming
    return (acc / l.unsqueeze(-1)).to(q.dtype), m + torch.log(l)  # lse stays float32


def _backward(q, k, v, out, lse, grad_out, causal, group, layout):
    rank, world = dist.get_rank(group), dist.get_world_size(group)
    seq_local, scale = q.shape[-2], 1.0 / math.sqrt(q.shape[-1])
    f32 = torch.float32
    q32, go32 = q.to(f32), grad_out.to(f32)
    delta = (go32 * out.to(f32)).sum(dim=-1, keepdim=True)
    grad_q = torch.zeros(q.shape, dtype=f32)
    kv = torch.stack((k, v)).contiguous()
    arriving, grad_works = None, []  # dK/dV of the block in hand, summed by the ranks before
    for step in range(world):
        source = (rank - step) % world
        incoming, works = _shift(kv, group, rank, world) if step < world - 1 else (kv, [])
        kv32 = kv.to(f32)
        grad_kv = torch.zeros(kv.shape, dtype=f32)  # this rank's share (the last one may still be in flight)
        for qc, kc, kind in _block_pairs(layout, rank, source, world, seq_local, causal):
            k_c, v_c, q_c, go = _rows(kv32[0], kc), _rows(kv32[1], kc), _rows(q32, qc), _rows(go32, qc)
            p = torch.exp(_scores(q_c, k_c, qc, kc, kind, scale) - _rows(lse.unsqueeze(-1), qc))
            ds = p * (go @ v_c.transpose(-2, -1) - _rows(delta, qc))
            _rows(grad_q, qc).add_(ds @ k_c * scale)
            _rows(grad_kv[0], kc).add_(ds.transpose(-2, -1) @ q_c * scale)
            _rows(grad_kv[1], kc).add_(p.transpose(-2, -1) @ go)
        _wait(grad_works)  # posted one step ago: it travelled while this block was computed
        if arriving is not None:
            grad_kv += arriving
        _wait(works)
        kv = incoming
        arriving, grad_works = _shift(grad_kv, group, rank, world)  # one hop on: home after the last
    _wait(grad_works)
    return grad_q.to(q.dtype), arriving[0].to(k.dtype), arriving[1].to(v.dtype)


# The dtypes a shard may have, by index: one int64 per tensor carries its dtype in the
# all-gather of the shapes (-1: anything else, refused).
DTYPES = (torch.float32, torch.float64, torch.float16, torch.bfloat16)


def gather_shards(who: str, q, k, v, group) -> list[tuple]:
    """Raise on every rank, before any K/V is sent, unless q, k and v have one shape and one
    floating dtype on this rank and the same on every rank; returns every rank's
    (shape, dtype) in rank order. One all-gather of the three shapes and dtypes: a check
    that raised on one rank alone would leave the others waiting in a send, and gloo aborts
    a process (SIGABRT, "Received data size doesn't match") when two ranks' messages
    differ in size, naming neither the shape nor the dtype."""
    world = dist.get_world_size(group)

    def row(t):
        code = DTYPES.index(t.dtype) if t.dtype in DTYPES else -1
        return [t.dim(), *t.shape, *[0] * (4 - t.dim()), code] if t.dim() <= 4 else [t.dim(), 0, 0, 0, 0, code]

    mine = torch.tensor([row(t) for t in (q, k, v)], dtype=torch.int64)
    rows = [torch.empty_like(mine) for _ in range(world)]
    dist.all_gather(rows, mine, group=group)
    names = [str(d).removeprefix("torch.") for d in DTYPES]
    seen = []
    for r, got in enumerate(rows):
        shapes = [tuple(x[1:1 + x[0]].tolist()) if x[0] <= 4 else f"{int(x[0])} dims" for x in got]
        dtypes = [names[x[-1]] if x[-1] >= 0 else "not floating point" for x in got]
        if any(x[0] != 4 for x in got) or len(set(shapes)) > 1:
            raise ValueError(f"{who}: q, k and v must have one shape (batch, heads, seq_local, "
                             f"head_dim); rank {r} has {shapes[0]}, {shapes[1]}, {shapes[2]}")
        if any(x[-1] < 0 for x in got) or len(set(dtypes)) > 1:
            raise ValueError(f"{who}: q, k and v must have one floating dtype ({', '.join(names)}); "
                             f"rank {r} has {dtypes[0]}, {dtypes[1]}, {dtypes[2]}")
        seen.append((shapes[0], dtypes[0]))
    if len({dtype for _, dtype in seen}) > 1:
        raise ValueError(f"{who} needs one dtype on every rank, got {[d for _, d in seen]} (rank "
                         f"order): cast every rank's q, k, v to the same dtype (a rank left in "
                         f"another would send blocks of another size)")
    return seen


def _check_shards(q, k, v, group, layout):
    """Raise on every rank, before anything is sent, unless every rank holds the same shape
    and dtype (:func:`gather_shards`), and for zig-zag an even shard."""
    world = dist.get_world_size(group)
    shapes = [shape for shape, _ in gather_shards("ring_attention", q, k, v, group)]
    if len(set(shapes)) > 1:
        raise ValueError(
            f"ring_attention needs the same shard shape on every rank, got {shapes} (rank order): "
            f"split the sequence evenly before sharding (a length divisible by {world} for the "
            f"contiguous layout, by {2 * world} for zig-zag)")
    if layout == "zigzag" and q.shape[-2] % 2:
        raise ValueError(f"a zig-zag shard holds two equal chunks: seq_local={q.shape[-2]} is odd; "
                         f"use a sequence length divisible by {2 * world}")


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
    if dist.get_world_size(group) > 1:
        _check_shards(q, k, v, group, layout)
    elif not (q.shape == k.shape == v.shape and q.dim() == 4 and q.dtype == k.dtype == v.dtype):
        raise ValueError(f"ring_attention: q, k and v must have one shape (batch, heads, seq_local, "
                         f"head_dim) and one dtype; got {tuple(q.shape)} {q.dtype}, "
                         f"{tuple(k.shape)} {k.dtype}, {tuple(v.shape)} {v.dtype}")
    return _RingAttention.apply(q, k, v, causal, group, layout)


def zigzag_shard(x: torch.Tensor, rank: int, world: int, dim: int = -2) -> torch.Tensor:
    """Rank ``rank``'s zig-zag shard of a full sequence: chunks r and 2n-1-r of 2n.

    Raises unless the length divides into 2n equal chunks (``chunk`` would give the ranks
    shards of different lengths). Every rank sees the same full length, so every rank raises."""
    if x.shape[dim] % (2 * world):
        raise ValueError(f"zigzag_shard: a sequence of {x.shape[dim]} positions does not split into "
                         f"2 x {world} = {2 * world} equal chunks; pad or trim it to a multiple of {2 * world}")
    pieces = x.chunk(2 * world, dim=dim)
    return torch.cat((pieces[rank], pieces[2 * world - 1 - rank]), dim=dim)


def zigzag_unshard(shards: list[torch.Tensor], dim: int = -2) -> torch.Tensor:
    """The full sequence back from every rank's zig-zag shard, in rank order."""
    firsts = [s.chunk(2, dim=dim)[0] for s in shards]
    seconds = [s.chunk(2, dim=dim)[1] for s in reversed(shards)]
    return torch.cat(firsts + seconds, dim=dim)
