"""Notebook 12 review: scratch.ring_attention / ulysses_attention on the inputs a learner
may give them: a different dtype on one rank, uneven shards (Ulysses), non-contiguous q,
bf16. Run: PYTHONPATH=<tree> python docs/reviews/repro/12_edge_inputs.py"""
import torch, torch.distributed as dist, torch.nn.functional as F
import ddp_lab
from ddp_lab import scratch


def case(name, fn):
    try:
        out = fn()
        return f"{name}: returned {out}"
    except Exception as e:
        return f"{name}: {type(e).__name__}: {str(e).splitlines()[0][:160]}"


def one_rank_other_dtype(how):
    rank, world = dist.get_rank(), dist.get_world_size()
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 4, 8 * world, 16, generator=g) for _ in range(3))
    ref = F.scaled_dot_product_attention(q, k, v).chunk(world, dim=-2)[rank]
    dt = torch.bfloat16 if rank == 1 else torch.float32
    mine = [t.chunk(world, dim=-2)[rank].to(dt) for t in (q, k, v)]
    fn = scratch.ring_attention if how == "ring" else scratch.ulysses_attention
    out = fn(*mine)
    return f"dtype {out.dtype}, max err vs fp32 reference {(out.float() - ref).abs().max().item():.3g}"


def uneven_ulysses():
    rank, world = dist.get_rank(), dist.get_world_size()
    seq = 9 if rank == 0 else 8   # rank 0 holds one more position
    g = torch.Generator().manual_seed(rank)
    q, k, v = (torch.randn(1, 4, seq, 16, generator=g) for _ in range(3))
    out = scratch.ulysses_attention(q, k, v)
    return f"shape {tuple(out.shape)}"


def noncontiguous_q():
    rank, world = dist.get_rank(), dist.get_world_size()
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 4, 8 * world, 16, generator=g) for _ in range(3))
    ref = F.scaled_dot_product_attention(q, k, v, is_causal=True).chunk(world, dim=-2)[rank]
    qt = q.chunk(world, dim=-2)[rank].transpose(1, 2).contiguous().transpose(1, 2)  # strided
    res = []
    for fn in (scratch.ring_attention, scratch.ulysses_attention):
        out = fn(qt, k.chunk(world, dim=-2)[rank], v.chunk(world, dim=-2)[rank], causal=True)
        res.append(f"{(out - ref).abs().max().item():.1e}")
    return f"contiguous={qt.is_contiguous()}, max err ring {res[0]}, ulysses {res[1]}"


CASES = {
    "ring, rank 1 in bf16, rank 0 in fp32": lambda: one_rank_other_dtype("ring"),
    "ulysses, rank 1 in bf16, rank 0 in fp32": lambda: one_rank_other_dtype("ulysses"),
    "ulysses, rank 0 holds 9 positions, rank 1 8": uneven_ulysses,
    "ring and ulysses, non-contiguous q": noncontiguous_q,
}


def one(name):
    return case(name, CASES[name])


if __name__ == "__main__":
    for name in CASES:   # one run each: a rank that aborts ends its run
        try:
            res = ddp_lab.run(one, world_size=2, args=(name,), echo=False, timeout=60).values
            for r, line in enumerate(res):
                print(f"rank {r}: {line}")
        except Exception as e:
            print(f"{name}: run failed: {type(e).__name__}: {str(e).splitlines()[0][:200]}")
            logs = "\n".join(getattr(e, "logs", []) or []) + "\n" + (getattr(e, "traceback", "") or "")
            for l in logs.splitlines():
                if any(w in l for w in ("gloo", "Gloo", "enforce", "terminate", "Error", "mismatch")):
                    print("    ", l.strip()[:300])
