"""Notebook 00's exercise: the largest value over all ranks, on every rank.

Each rank gets a different random number (a fresh seed per check), so no closed form of
the rank or the world size can pass; the answer is compared with what
``dist.all_reduce(op=MAX)`` gives on the same numbers.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from ddp_lab.exercises.driver import WORLD_SIZES, generator, new_seed, run_ranks
from ddp_lab.exercises.driver import where as on
from ddp_lab.exercises.registry import Exercise, ExerciseFailed


def max_over_ranks(value: float) -> float:
    """Reference: every rank contributes its value; MAX keeps the largest, everywhere."""
    t = torch.tensor([float(value)], dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return t.item()


def _trial(fn, seed: int) -> tuple:
    rank = dist.get_rank()
    value = round(torch.rand((), generator=generator(seed, rank)).item() * 100, 3)
    got = fn(value)
    expected = torch.tensor([value], dtype=torch.float64)
    dist.all_reduce(expected, op=dist.ReduceOp.MAX)
    return value, got, expected.item()


def check_max_over_ranks(fn) -> str:
    seed = new_seed()
    for n in WORLD_SIZES:
        where = on(n, seed)
        values = run_ranks(_trial, n, (fn, seed), where=where)
        inputs = [v for v, _, _ in values]
        for rank, (value, got, expected) in enumerate(values):
            if not isinstance(got, (int, float)) or abs(float(got) - expected) > 1e-9:
                raise ExerciseFailed(
                    f"{where}: the ranks held {inputs}; rank {rank} returned {got!r}, "
                    f"expected the largest, {expected}, on every rank. Put your value in a "
                    "tensor and all_reduce it with op=dist.ReduceOp.MAX.")
    return f"every rank returned the largest value on 1-4 ranks (seed {seed})"


EXERCISES = (
    Exercise(
        name="00.max_over_ranks",
        notebook="00_launching_from_jupyter",
        summary="max_over_ranks(value): the largest value held by any rank, on every rank",
        hint="torch.tensor([value]), then dist.all_reduce(t, op=dist.ReduceOp.MAX); "
             "return t.item().",
        solution=max_over_ranks,
        checker=check_max_over_ranks,
    ),
)
