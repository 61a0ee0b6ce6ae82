"""``ddp-lab doctor``: is this machine ready for the course? (the usual "test the environment
first" check: one process forward/backward first, then real ranks talking.)"""

from __future__ import annotations

import os
import platform
import time
from dataclasses import dataclass


@dataclass(frozen=True)
class Check:
    name: str
    ok: bool
    detail: str


def environment_facts() -> list[str]:
    import torch
    import torch.distributed as dist
    backends = {name: getattr(dist, f"is_{name}_available")() for name in ("gloo", "nccl", "mpi")}
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return [f"python {platform.python_version()}, torch {torch.__version__}, {platform.system()}",
            "backends: " + ", ".join(f"{k} {'yes' if v else 'no'}" for k, v in backends.items()),
            f"CPU cores usable: {cores}, CUDA GPUs: {gpus}",
            f"network of each run: {isolation_fact()}"]


def isolation_fact() -> str:
    """Where runs live: a private network (other users cannot reach them), or not and why."""
    from ddp_lab.launch.network import isolation
    try:
        return isolation.describe()
    except ValueError as exc:  # a DDP_LAB_ISOLATION value it does not know
        return str(exc)


def single_process_step() -> Check:
    """Forward and backward of the tutorial's ToyModel in this process, no distribution."""
    import torch
    from ddp_lab.course.models import ToyModel
    torch.manual_seed(0)
    model = ToyModel()
    loss = model(torch.randn(20, 10)).pow(2).mean()
    loss.backward()
    finite = all(torch.isfinite(p.grad).all() for p in model.parameters())
    return Check("single-process forward/backward", bool(finite),
                 f"loss {loss.item():.4f}, gradients finite: {finite}")


def two_rank_all_reduce() -> Check:
    import ddp_lab
    from ddp_lab.course.ch00_launching.launching import all_reduce_ranks
    start = time.perf_counter()
    try:
        res = ddp_lab.run(all_reduce_ranks, world_size=2, timeout=120, echo=False)
    except Exception as exc:  # noqa: BLE001 - the doctor reports, it does not crash
        return Check("2-rank all_reduce", False, f"{type(exc).__name__}: {exc}")
    ok = res.values == [[1.0], [1.0]]
    return Check(f"2-rank all_reduce ({res.backend})", ok,
                 f"every rank got {res.values[0]} (expected [1.0]) in "
                 f"{time.perf_counter() - start:.2f} s")


def verdict(checks: list[Check]) -> str:
    if all(c.ok for c in checks):
        return "READY: every check passed; open notebooks/00_launching_from_jupyter.ipynb."
    failed = ", ".join(c.name for c in checks if not c.ok)
    return (f"NOT READY: {failed} failed. Reinstall torch (pip install torch) and ddp-lab "
            "(pip install -e .), then run `ddp-lab doctor` again; the README's "
            "troubleshooting section lists the usual causes.")


def main() -> int:
    for fact in environment_facts():
        print(fact)
    checks = []
    for check in (single_process_step, two_rank_all_reduce):
        checks.append(check())
        c = checks[-1]
        print(f"[{'ok' if c.ok else 'FAIL'}] {c.name}: {c.detail}", flush=True)
    print(verdict(checks))
    return 0 if all(c.ok for c in checks) else 1
