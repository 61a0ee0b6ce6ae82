"""Notebook 03's exercise: all_to_all built from scatter.

Every other collective is switched off while the learner's function runs, so the answer has
to come from ``dist.scatter`` (one per source rank); the chunks are random tensors from the
check's seed, and every rank's result is compared with what torch's own ``all_gather`` of
everybody's chunks says it should have received.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from ddp_lab.exercises.builtins_off import COLLECTIVES, switched_off
from ddp_lab.exercises.driver import (WORLD_SIZES, new_seed, random_tensor, run_ranks,
                                     tensor_problem)
from ddp_lab.exercises.driver import where as on
from ddp_lab.exercises.registry import Exercise, ExerciseFailed

NOT_SCATTER = tuple(name for name in COLLECTIVES if name != "scatter")


def all_to_all_by_scatter(chunks: list[torch.Tensor]) -> list[torch.Tensor]:
    """Reference: N scatters. In scatter number ``src``, rank ``src`` hands out its chunks
    (chunk j to rank j) and every rank keeps what it gets as item ``src``."""
    rank, world = dist.get_rank(), dist.get_world_size()
    received = []
    for src in range(world):
        buffer = torch.empty_like(chunks[rank])
        dist.scatter(buffer, list(chunks) if rank == src else None, src=src)
        received.append(buffer)
    return received


def _trial(fn, seed: int):
    rank, world = dist.get_rank(), dist.get_world_size()
    chunks = [random_tensor(seed, rank * world + j) for j in range(world)]
    with switched_off(NOT_SCATTER + ("send", "recv", "isend", "irecv", "batch_isend_irecv"),
                      "build all_to_all from dist.scatter"):
        got = fn([c.clone() for c in chunks])
    everybody = [torch.empty_like(torch.stack(chunks)) for _ in range(world)]
    dist.all_gather(everybody, torch.stack(chunks))
    return got, [everybody[src][rank] for src in range(world)]


def check_all_to_all(fn) -> str:
    seed = new_seed()
    for n in WORLD_SIZES:
        values = run_ranks(_trial, n, (fn, seed), where=on(n, seed),
                           hang_hint="Every rank must call scatter the same number of "
                           "times, with the same src in the same order.")
        for rank, (got, expected) in enumerate(values):
            if not isinstance(got, (list, tuple)) or len(got) != n:
                raise ExerciseFailed(f"{on(n, seed)}, rank {rank} returned {got!r}: expected "
                                     f"a list of {n} tensors, item i being what rank i sent")
            for i, (mine, want) in enumerate(zip(got, expected)):
                problem = tensor_problem(mine, want)
                if problem:
                    raise ExerciseFailed(
                        f"{on(n, seed)}, rank {rank}, item [{i}] should be chunk [{rank}] of "
                        f"rank {i}'s list (what rank {i} sent to rank {rank}): {problem}")
    return f"the same as torch's all_to_all on 1-4 ranks (seed {seed})"


EXERCISES = (
    Exercise(
        name="03.all_to_all",
        notebook="03_collectives",
        summary="my_all_to_all(chunks): chunk j goes to rank j; item i is what rank i sent me",
        hint="one dist.scatter per src in range(world_size): rank src passes its chunks as "
             "scatter_list (None elsewhere), everybody receives into a fresh buffer.",
        solution=all_to_all_by_scatter,
        checker=check_all_to_all,
    ),
)
