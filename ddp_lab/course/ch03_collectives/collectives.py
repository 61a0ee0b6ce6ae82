"""Notebook 03: every collective, run on real ranks, checked against its math.

Rank r always starts from ``rank_values(r, numel)`` = 1, 2, 3, ... plus 10*r, so values are
distinct across ranks (the pictures colour a value by the rank it came from). Each collective
worker returns ``{"before": ..., "after": ...}``: what this rank held before and after the
call. ``reference.expected`` computes the afters from the befores in one process, from the
math alone; ``support`` tries which ReduceOps and collectives the backend has; what they cost,
and the ways they go wrong, are in ``costs``.
"""

from __future__ import annotations

import os

import torch
import torch.distributed as dist

from ddp_lab.launch.errors import short_message

ROOT = 0  # src/dst of the rooted collectives (broadcast, reduce, gather, scatter)


def rank_values(rank: int, numel: int, dtype: str = "int64") -> torch.Tensor:
    return torch.arange(1, numel + 1, dtype=getattr(torch, dtype)) + 10 * rank


def rank_and_world() -> tuple[int, int]:
    return dist.get_rank(), dist.get_world_size()


def reduce_op(name: str):
    # PREMUL_SUM is a factory (docs: ``ReduceOp.PREMUL_SUM(factor)``), not a plain op.
    return dist.ReduceOp.PREMUL_SUM(2.0) if name == "PREMUL_SUM" else getattr(dist.ReduceOp, name)


# --- the collectives, one worker each ------------------------------------------------------

def broadcast(numel: int = 3, dtype: str = "int64") -> dict:
    t = rank_values(dist.get_rank(), numel, dtype)
    before = t.clone()
    dist.broadcast(t, src=ROOT)  # in place: every rank's t now holds the root's values
    return {"before": before, "after": t}


def reduce(numel: int = 3, dtype: str = "int64", op: str = "SUM") -> dict:
    """Only the root's result is defined: gloo uses the other ranks' tensors as scratch."""
    t = rank_values(dist.get_rank(), numel, dtype)
    before = t.clone()
    dist.reduce(t, dst=ROOT, op=reduce_op(op))
    return {"before": before, "after": t}


def all_reduce(numel: int = 3, dtype: str = "int64", op: str = "SUM") -> dict:
    t = rank_values(dist.get_rank(), numel, dtype)
    before = t.clone()
    dist.all_reduce(t, op=reduce_op(op))
    return {"before": before, "after": t}


def gather(numel: int = 3, dtype: str = "int64") -> dict:
    rank, world = rank_and_world()
    t = rank_values(rank, numel, dtype)
    # gather_list: None on the other ranks, one tensor shaped like t per rank on the root.
    out = [torch.zeros_like(t) for _ in range(world)] if rank == ROOT else None
    dist.gather(t, gather_list=out, dst=ROOT)
    return {"before": t, "after": out}


def all_gather(numel: int = 3, dtype: str = "int64") -> dict:
    rank, world = rank_and_world()
    t = rank_values(rank, numel, dtype)
    out = [torch.zeros_like(t) for _ in range(world)]
    dist.all_gather(out, t)
    return {"before": t, "after": out}


def all_gather_single(numel: int = 3, dtype: str = "int64") -> dict:
    """all_gather into one preallocated tensor: no list, no torch.cat afterwards (torch 2.13's
    name; ``all_gather_into_tensor`` forwards to it with a FutureWarning)."""
    rank, world = rank_and_world()
    t = rank_values(rank, numel, dtype)
    out = torch.zeros(world * numel, dtype=t.dtype)
    dist.all_gather_single(out, t)
    return {"before": t, "after": out}


def scatter(numel: int = 2, dtype: str = "int64") -> dict:
    """The root splits ``numel * world_size`` values into equal parts, one per rank."""
    rank, world = rank_and_world()
    parts = list(rank_values(rank, numel * world, dtype).chunk(world)) if rank == ROOT else None
    out = torch.zeros(numel, dtype=getattr(torch, dtype))
    dist.scatter(out, scatter_list=parts, src=ROOT)
    return {"before": parts, "after": out}


def reduce_scatter(numel: int = 7, dtype: str = "int64", op: str = "SUM") -> dict:
    """Each rank's ``numel`` values, split into world_size parts (unequal when numel is not
    divisible): rank i ends with part i reduced over all ranks."""
    rank, world = rank_and_world()
    parts = list(torch.tensor_split(rank_values(rank, numel, dtype), world))
    out = torch.zeros_like(parts[rank])
    dist.reduce_scatter(out, [p.clone() for p in parts], op=reduce_op(op))
    return {"before": parts, "after": out}


def reduce_scatter_single(numel: int = 2, dtype: str = "int64", op: str = "SUM") -> dict:
    """One flat input of ``numel * world_size`` values in, ``numel`` reduced values out (torch
    2.13's name; ``reduce_scatter_tensor`` forwards to it with a FutureWarning)."""
    rank, world = rank_and_world()
    t = rank_values(rank, numel * world, dtype)
    out = torch.zeros(numel, dtype=t.dtype)
    dist.reduce_scatter_single(out, t.clone(), op=reduce_op(op))
    return {"before": t, "after": out}


def all_to_all(numel: int = 2, dtype: str = "int64") -> dict:
    """Part j of rank i goes to rank j, as part i: a transpose of the (rank, part) grid."""
    rank, world = rank_and_world()
    parts = list(rank_values(rank, numel * world, dtype).chunk(world))
    out = [torch.zeros_like(parts[0]) for _ in range(world)]
    dist.all_to_all(out, parts)
    return {"before": parts, "after": out}


def all_to_all_single(numel: int = 7, dtype: str = "int64") -> dict:
    """all_to_all on one flat tensor, with unequal parts (split sizes) where numel demands."""
    rank, world = rank_and_world()
    t = rank_values(rank, numel, dtype)
    sizes = [len(p) for p in torch.tensor_split(t, world)]  # the same on every rank
    out = torch.zeros(sizes[rank] * world, dtype=t.dtype)
    dist.all_to_all_single(out, t, output_split_sizes=[sizes[rank]] * world,
                           input_split_sizes=sizes)
    return {"before": list(t.split(sizes)), "after": list(out.split(sizes[rank]))}


COLLECTIVES = {f.__name__: f for f in (
    broadcast, reduce, all_reduce, gather, all_gather, all_gather_single, scatter,
    reduce_scatter, reduce_scatter_single, all_to_all, all_to_all_single)}
REDUCING = {"reduce", "all_reduce", "reduce_scatter", "reduce_scatter_single"}


def tour(dtype: str = "int64") -> dict:
    """Every collective in one run. One the backend lacks becomes {"error": message}: such an
    error is raised on every rank before anything is sent, so the ranks stay in step."""
    results = {}
    for name, demo in COLLECTIVES.items():
        try:
            results[name] = demo(dtype=dtype)
        except RuntimeError as exc:
            results[name] = {"error": short_message(str(exc))}
    return results


def five_collectives() -> dict:
    """barrier, reduce, all_gather, all_reduce and broadcast, in that order, in one function:
    the classic first multi-collective example, with ``reduce`` called by every rank (it
    prints is_available, then each rank and world size twice: from the environment and
    from the process group)."""
    rank, world = rank_and_world()
    if rank == 0:
        print(f"dist.is_available: {dist.is_available()}")
    print(f"rank: {os.environ['RANK']}, {rank}")
    print(f"world_size: {os.environ['WORLD_SIZE']}, {world}")
    dist.barrier()
    reduced = reduce(1)["after"].item()  # every rank calls it; only the root's result counts
    return {"all_gather": [t.item() for t in all_gather(1)["after"]],
            "all_reduce": all_reduce(1)["after"].item(),
            "reduce": reduced if rank == ROOT else None,
            "broadcast": broadcast(1)["after"].item()}
