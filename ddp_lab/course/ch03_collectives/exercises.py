"""Notebook 03's exercise: all_to_all built from scatter.

Every other collective and the point-to-point calls are switched off at the dispatcher while
the learner's function runs (every form: imported names, process-group methods, functional
collectives), and the scatters are counted there too: an all-to-all from scatters is one
scatter per source rank, each moving one chunk per rank, so a count or a size that differs
(no scatter at all, whole lists scattered, a scatter of garbage beside a side channel) is
named; the store, files and threads are closed while it runs. The chunks are random, int64
on some world sizes and float32 on the others (both in every check), made by the checker,
which hands each rank only its own (:func:`~ddp_lab.exercises.sealed.deal`) and compares
every rank's result with the chunks the others were given for it.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from ddp_lab.course.collective_trace import FAMILIES, CollectiveTrace
from ddp_lab.exercises.driver import (WORLD_SIZES, each_world, full_bits_tensor, new_seed,
                                      tensor_problem)
from ddp_lab.exercises.registry import Exercise
from ddp_lab.exercises.sealed import deal

ONLY_SCATTER = "build all_to_all from dist.scatter"


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


def rank_chunks(seed: int, n: int) -> list[list[torch.Tensor]]:
    """Every rank's list of chunks for one world size: ``[rank][j]`` goes to rank j."""
    return [[full_bits_tensor(seed, n, rank, j) for j in range(n)] for rank in range(n)]


def _trial(fn, dealt):
    """The learner's result for this rank's chunks, and the bytes each scatter moved here."""
    chunks = dealt.take()
    with CollectiveTrace(forbid=set(FAMILIES) - {"scatter"}, why=ONLY_SCATTER) as trace:
        got = fn(chunks)
    return got, [call.nbytes for call in trace.of("scatter")]


def check_all_to_all(fn) -> str:
    seed = new_seed()
    chunks = {n: rank_chunks(seed, n) for n in WORLD_SIZES}

    def judge(value: tuple, rank: int, n: int) -> str | None:
        got, scatters = value
        expected = [chunks[n][src][rank] for src in range(n)]
        return (_result_problem(got, expected, chunks[n][rank], rank, n)
                or _cost_problem(scatters, expected[0], n))

    each_world(_trial, lambda n: (fn, deal(chunks[n])), judge, seed,
               hang_hint="Every rank must call scatter the same number of times, with the "
                         "same src in the same order.",)
    return (f"every rank got chunk [rank] of every rank's list, in rank order (what "
            f"dist.all_to_all gives), with one scatter of one chunk per rank per source rank, "
            f"on 1-4 ranks, int64 and float32 (seed {seed})")


def _result_problem(got, expected: list, chunks: list, rank: int, n: int) -> str | None:
    if not isinstance(got, (list, tuple)) or len(got) != n:
        return (f" returned {got!r}: expected a list of {n} tensors, item i being what rank "
                f"i sent")
    for i, (item, want) in enumerate(zip(got, expected)):
        problem = tensor_problem(item, want, mine=chunks[i])  # its own chunk i, kept?
        if problem:
            return (f", item [{i}] should be chunk [{rank}] of rank {i}'s list (what rank {i} "
                    f"sent to rank {rank}): {problem}")
    return None


def _cost_problem(scatters: list, chunk: torch.Tensor, n: int) -> str | None:
    one = chunk.numel() * chunk.element_size()
    if len(scatters) != n:
        return (f" made {len(scatters)} scatter(s): an all-to-all from scatters is exactly "
                f"{n}, one per source rank (each rank hands out its chunks once); the data "
                "must travel through them, not around them.")
    if any(size != one for size in scatters):
        return (f": its scatters moved {scatters} bytes per rank, and a chunk is {one} bytes: "
                "each scatter hands every rank one chunk, no more.")
    return None


EXERCISES = (
    Exercise(
        name="03.all_to_all",
        notebook="03_collectives",
        summary="my_all_to_all(chunks): chunk j goes to rank j; item i is what rank i sent me",
        hint="one scatter hands out one rank's chunks, one to each rank; every rank has "
             "chunks to hand out, and every rank must take part in every scatter (with the "
             "same src, in the same order).",
        recipe="received = []; for src in range(world_size): buffer = "
               "torch.empty_like(chunks[rank]); dist.scatter(buffer, list(chunks) if rank == "
               "src else None, src=src); received.append(buffer). Return received: item src "
               "is what rank src sent you.",
        solution=all_to_all_by_scatter,
        checker=check_all_to_all,
    ),
)
