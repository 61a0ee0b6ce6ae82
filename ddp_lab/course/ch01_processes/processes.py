"""Notebook 01, sections 1, 4 and 5: ranks, groups and how they line up.

A process group is a set of processes that can talk to each other; each member has a
*rank* (0..world_size-1). Here: the rank and world size a group reports, subgroups, which
backends this torch really has, ``barrier()`` on a timeline, and printing in rank order
(the exercises are in ``ddp_lab/course/ch01_processes/exercises.py``). How the ranks find each
other in the first place (init methods and their stores) is in ``stores.py``.
"""

from __future__ import annotations

import io
import os
import sys
import time
from contextlib import redirect_stdout

# The backends torch 2.13 builds in (Backend.backend_list in distributed_c10d.py, less
# "fake", a test double); third-party ones come in through dist.Backend.register_backend.
BACKENDS = ("gloo", "nccl", "mpi", "ucc", "xccl")
DEVICE = {"nccl": "cuda", "xccl": "xpu"}  # the only tensors they move (backend_capability)


# -- ranks and groups ------------------------------------------------------------------
def rank_lines() -> list[str]:
    """What a first DDP script typically prints: the rank and world size the process group
    reports, next to what the launcher put in the environment (they must agree)."""
    import torch.distributed as dist
    return [f"rank: {dist.get_rank()}, {os.environ['RANK']}",
            f"world_size: {dist.get_world_size()}, {os.environ['WORLD_SIZE']}"]


def subgroups() -> dict:
    """Split the world into even and odd ranks with ``dist.new_group`` and sum within each.

    ``new_group`` is itself collective by default: every rank must call it for every group,
    members or not, in the same order (``use_local_synchronization=True`` lets only the
    members call it). A subgroup reuses the default group's store, so it cannot
    switch to another init method (see ``stores.join_group``).
    """
    import torch
    import torch.distributed as dist
    rank, world = dist.get_rank(), dist.get_world_size()
    groups = {name: dist.new_group(ranks) for name, ranks in
              (("even", list(range(0, world, 2))), ("odd", list(range(1, world, 2)))) if ranks}
    name = "even" if rank % 2 == 0 else "odd"
    t = torch.tensor([float(rank)])
    dist.all_reduce(t, group=groups[name])
    return {"rank": rank, "group": name, "group_rank": dist.get_rank(groups[name]),
            "group_size": dist.get_world_size(groups[name]), "group_sum": t.item()}


def probe_backends() -> dict[str, dict]:
    """For each backend: is it compiled into this torch, and does a 1-rank group with it
    really all_reduce here? Run it on one rank: it replaces that rank's default group."""
    import torch.distributed as dist
    dist.destroy_process_group()
    compiled = {name: getattr(dist, f"is_{name}_available")() for name in BACKENDS}
    return {name: {"compiled": compiled[name], "works": _try_backend(name)} for name in BACKENDS}


def _try_backend(name: str) -> str:
    import torch
    import torch.distributed as dist
    try:
        dist.init_process_group(name, store=dist.HashStore(), rank=0, world_size=1)
        dist.all_reduce(torch.ones(1, device=DEVICE.get(name, "cpu")))
        return "yes"
    except Exception as exc:  # noqa: BLE001 - the reason it fails is the answer
        return f"no: {str(exc).splitlines()[0]}"
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


# -- barriers and printing in rank order --------------------------------------------------
def barrier_timeline(work_s=(0.10, 0.40, 0.25, 0.15)) -> list[tuple[str, float, float]]:
    """Work for a rank-dependent time, then ``dist.barrier()``. Returns this rank's
    (label, start, end) spans in time.time() seconds (one clock for all ranks on a machine)."""
    import torch.distributed as dist
    start = time.time()
    time.sleep(work_s[dist.get_rank() % len(work_s)])
    arrived = time.time()
    dist.barrier()
    return [("work", start, arrived), ("waiting in barrier", arrived, time.time())]


def span_times(spans_per_rank, label: str) -> list[tuple[float, float]]:
    """(start, end) of the span called ``label`` on each rank."""
    return [next((s, e) for name, s, e in spans if name == label) for spans in spans_per_rank]


def dprint(*args, **kwargs) -> None:
    """Print on one rank at a time, in rank order (the ``dprint`` helper people write around
    ``mp.spawn``): in turn r only
    rank r prints, and the barrier after each turn keeps rank r+1 from writing before
    rank r has. It orders the *writes*; it costs world_size barriers per call."""
    import torch.distributed as dist
    for turn in range(dist.get_world_size()):
        if turn == dist.get_rank():
            print(*args, **kwargs, flush=True)
        dist.barrier()


class StampedStdout(io.TextIOBase):
    """stdout that also notes when each line was written (time.time()), so lines from
    several processes can be put back in the order they were really written. Used as
    ``with redirect_stdout(StampedStdout(sys.stdout)) as out: ...``, then ``out.lines``."""

    def __init__(self, target):
        self.target, self.lines, self.partial = target, [], ""

    def write(self, text: str) -> int:
        self.target.write(text)
        *complete, self.partial = (self.partial + text).split("\n")
        now = time.time()
        self.lines.extend((now, line) for line in complete)
        return len(text)

    def flush(self) -> None:
        self.target.flush()


def print_freely(work_s: float = 0.01) -> list[tuple[float, str]]:
    """``rank_lines``, printed as soon as each rank gets there, with a little work
    between them (after a barrier that lines the ranks up, as a training step would):
    nothing orders one rank's lines against another's."""
    import torch.distributed as dist
    dist.barrier()
    with redirect_stdout(StampedStdout(sys.stdout)) as out:
        for line in rank_lines():
            print(line)
            time.sleep(work_s)
    return out.lines


def print_in_rank_order() -> list[tuple[float, str]]:
    """The same lines through ``dprint``: rank 0's block, then rank 1's, and so on."""
    import torch.distributed as dist
    dist.barrier()
    with redirect_stdout(StampedStdout(sys.stdout)) as out:
        dprint("\n".join(rank_lines()))
    return out.lines


def write_order(stamped_per_rank) -> list[tuple[int, str]]:
    """(rank, line) for every line of every rank, in the order they were written."""
    merged = sorted((t, rank, line) for rank, lines in enumerate(stamped_per_rank)
                    for t, line in lines)
    return [(rank, line) for _, rank, line in merged]
