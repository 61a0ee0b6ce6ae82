"""Notebook 00: launching multi-rank code from Jupyter.

Worker functions the notebook runs on several ranks, plus the two experiments it shows:
why ``torch.multiprocessing.spawn`` fails on a notebook function, and what a launch costs
with torchrun, mp.spawn and ddp_lab (cold and warm).
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass


def hello() -> dict:
    """Who am I? What torchrun would tell a rank, read from the process group and env."""
    import torch.distributed as dist
    info = {"rank": dist.get_rank(), "world_size": dist.get_world_size(),
            "local_rank": int(os.environ["LOCAL_RANK"]), "backend": dist.get_backend(),
            "pid": os.getpid(), "master": f"{os.environ['MASTER_ADDR']}:{os.environ['MASTER_PORT']}"}
    print(f"rank: {info['rank']}, world_size: {info['world_size']}, pid: {info['pid']}")
    return info


def all_reduce_ranks() -> list[float]:
    """Every rank contributes its rank number; all_reduce(SUM) gives each the total."""
    import torch
    import torch.distributed as dist
    t = torch.tensor([float(dist.get_rank())])
    dist.all_reduce(t, op=dist.ReduceOp.SUM)
    print(f"after all_reduce: {t.tolist()}")
    return t.tolist()


def crash_on_last_rank() -> int:
    """The last rank raises before a collective; its peers then fail in all_reduce."""
    import torch
    import torch.distributed as dist
    rank, world = dist.get_rank(), dist.get_world_size()
    if rank == world - 1:
        raise ValueError(f"rank {rank} read a corrupt batch")
    t = torch.ones(1)
    dist.all_reduce(t)
    return rank


def hang_without_rank0(busy_s: float = 3600.0) -> int:
    """Rank 0 is busy elsewhere and never joins the all_reduce its peers wait in."""
    import torch
    import torch.distributed as dist
    if dist.get_rank() == 0:
        time.sleep(busy_s)
    else:
        dist.all_reduce(torch.ones(1))
    return dist.get_rank()


@dataclass(frozen=True)
class SpawnAttempt:
    """What ``torch.multiprocessing.spawn`` did with a function: the parent's exception and
    what the children wrote to stderr (which Jupyter never shows in the cell)."""

    exception: str
    children_stderr: str

    @property
    def child_errors(self) -> list[str]:
        return [line for line in self.children_stderr.splitlines()
                if line.startswith(("AttributeError", "PicklingError", "RuntimeError"))]


def try_mp_spawn(fn, nprocs: int = 2) -> SpawnAttempt:
    """Run ``mp.spawn(fn, nprocs=nprocs)`` with stderr captured at the file-descriptor level,
    since the children write there directly, bypassing the notebook's output capture."""
    import tempfile
    import torch.multiprocessing as mp
    with tempfile.TemporaryFile() as log:
        saved = os.dup(2)
        os.dup2(log.fileno(), 2)
        try:
            mp.spawn(fn, nprocs=nprocs)
            outcome = "no exception"
        except Exception as exc:  # noqa: BLE001 - the failure is the lesson
            outcome = f"{type(exc).__name__}: {exc}"
        finally:
            os.dup2(saved, 2)
            os.close(saved)
        log.seek(0)
        return SpawnAttempt(outcome, log.read().decode("utf-8", "replace"))


