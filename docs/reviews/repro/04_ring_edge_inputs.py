"""Notebook 04 (and 03): the from-scratch ring on inputs a learner will give it.
Run: flock /tmp/ddp-lab-cpu.lock .venv/bin/python docs/reviews/repro/04_ring_edge_inputs.py"""
import torch
import torch.distributed as dist

import ddp_lab


def mixed_dtype(kind):
    """rank 0 float32, rank 1 another dtype: the ring and dist.all_reduce side by side."""
    from ddp_lab.course.ch04_allreduce.allreduce import ring_all_reduce
    rank = dist.get_rank()
    other = {"int32": torch.int32, "float64": torch.float64}[kind]
    t = torch.arange(1, 9, dtype=torch.float32 if rank == 0 else other)
    out = {}
    for name, fn in (("ring", ring_all_reduce), ("builtin", dist.all_reduce)):
        x = t.clone()
        try:
            fn(x)
            out[name] = x.tolist()
        except Exception as exc:  # noqa: BLE001
            out[name] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:100]}"
    return out


def low_precision():
    from ddp_lab.course.ch04_allreduce.allreduce import ring_all_reduce
    rank = dist.get_rank()
    out = {}
    for dtype in (torch.bfloat16, torch.float16):
        t = (torch.linspace(-1, 1, 11) * (rank + 1)).to(dtype)
        t[0] = float("nan") if rank == 0 else 1.0
        t[1] = -0.0
        a, b = t.clone(), t.clone()
        ring_all_reduce(a)
        dist.all_reduce(b)
        out[str(dtype)] = (a.float().tolist()[:3], torch.equal(a[1:], b[1:]), a[0].isnan().item())
    return out


def scatter_unequal():
    """03 cell 25: on gloo scatter_list entries must all have the same size."""
    rank = dist.get_rank()
    parts = list(torch.tensor_split(torch.arange(5.0), 2)) if rank == 0 else None
    out = torch.zeros(3 if rank == 0 else 2)
    try:
        dist.scatter(out, parts, src=0)
        return out.tolist()
    except Exception as exc:  # noqa: BLE001
        return f"{type(exc).__name__}: {str(exc).splitlines()[0][:120]}"


if __name__ == "__main__":
    for kind in ("int32", "float64"):
        try:
            print(f"mixed float32/{kind}:", ddp_lab.run(mixed_dtype, world_size=2, args=(kind,),
                                                         echo=False, timeout=30).values)
        except Exception as exc:  # noqa: BLE001
            print(f"mixed float32/{kind}: {type(exc).__name__}: {str(exc)[:300]}")
    print("bf16/fp16, NaN, -0.0:", ddp_lab.run(low_precision, world_size=3, echo=False).values)
    print("scatter unequal:", ddp_lab.run(scatter_unequal, world_size=2, echo=False).values)
