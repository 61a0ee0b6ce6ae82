"""ddp_lab.scratch.ring.ring_reduce_scatter (exercise 04.reduce_scatter's reference, exported by
ddp_lab.scratch) on a tensor that N does not divide, next to dist.reduce_scatter_single.
Run: flock /tmp/ddp-lab-cpu.lock .venv/bin/python docs/reviews/repro/04_reduce_scatter_uneven.py"""
import torch
import torch.distributed as dist

import ddp_lab


def uneven(numel):
    from ddp_lab.scratch.ring import ring_reduce_scatter
    rank = dist.get_rank()
    t = torch.arange(numel) + 100 * rank
    out = {}
    try:
        out["scratch"] = ring_reduce_scatter(t.clone()).tolist()
    except Exception as exc:  # noqa: BLE001
        out["scratch"] = f"{type(exc).__name__}: {exc}"
    try:
        o = torch.empty(numel // 4, dtype=t.dtype)
        dist.reduce_scatter_single(o, t.clone())
        out["builtin"] = o.tolist()
    except Exception as exc:  # noqa: BLE001
        out["builtin"] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:90]}"
    return out


if __name__ == "__main__":
    for numel in (10, 6):
        try:
            print(numel, ddp_lab.run(uneven, world_size=4, args=(numel,), echo=False, timeout=20).values)
        except Exception as exc:  # noqa: BLE001
            print(numel, type(exc).__name__, str(exc)[:300])
