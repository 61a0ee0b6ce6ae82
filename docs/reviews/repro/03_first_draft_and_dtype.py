"""Notebook 03 cell 5 (the first draft, reduce on the root only: "a hang") and notebook 03b
cells 28-30 (a dtype mismatch of the same element size: no case shows it; and under DETAIL).
Run: flock /tmp/ddp-lab-cpu.lock .venv/bin/python docs/reviews/repro/03_first_draft_and_dtype.py"""
import torch
import torch.distributed as dist

import ddp_lab


def first_draft():
    rank = dist.get_rank()
    dist.barrier()
    t = torch.tensor([1 + 10 * rank])
    if rank == 0:
        dist.reduce(t, dst=0)          # the draft: only the root calls reduce
    out = [torch.zeros(1, dtype=torch.int64) for _ in range(3)]
    dist.all_gather(out, torch.tensor([1 + 10 * rank]))
    s = torch.tensor([1 + 10 * rank])
    dist.all_reduce(s)
    return {"reduce": t.tolist(), "all_gather": [o.item() for o in out], "all_reduce": s.item()}


def dtype_mismatch(detail: bool):
    rank = dist.get_rank()
    if detail:
        dist.set_debug_level(dist.DebugLevel.DETAIL)
    group = dist.new_group(backend="gloo")
    t = torch.arange(1, 5, dtype=torch.float32 if rank == 0 else torch.int32)
    try:
        dist.all_reduce(t, group=group)
        return t.tolist()
    except RuntimeError as exc:
        return "RuntimeError: " + str(exc).splitlines()[0][:120]


if __name__ == "__main__":
    try:
        print("first draft:", ddp_lab.run(first_draft, world_size=3, echo=False, timeout=15).values)
    except Exception as exc:  # noqa: BLE001
        print("first draft:", type(exc).__name__, str(exc)[:400])
    for detail in (False, True):
        print(f"float32 vs int32 all_reduce, DETAIL={detail}:",
              ddp_lab.run(dtype_mismatch, world_size=2, args=(detail,), echo=False, timeout=20).values)
