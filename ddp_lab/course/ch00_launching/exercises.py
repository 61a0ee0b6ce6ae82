"""Notebook 00's exercise: the largest value over all ranks, on every rank.

Each rank gets a different random number (a fresh seed per check), so no closed form of
the rank or the world size can pass; the answer is compared with what
``dist.all_reduce(op=MAX)`` gives on the same numbers. Any collective, reached any way, may
do it: the check judges the number each rank returns, at a tolerance that a float32 tensor
(``torch.tensor([value])``'s default dtype) meets, so the first hint works as written.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from ddp_lab.exercises.driver import each_world, generator, new_seed, number_problem
from ddp_lab.exercises.registry import Exercise

# float32 keeps 24 bits of mantissa: a value rounded through it is off by at most 2**-24 of
# itself (6e-8); a wrong answer (another rank's value, a sum, a mean) is off by far more.
FLOAT32_REL = 1e-6


def max_over_ranks(value: float) -> float:
    """Reference: every rank contributes its value; MAX keeps the largest, everywhere."""
    t = torch.tensor([float(value)], dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return t.item()


def _trial(fn, seed: int) -> tuple:
    rank = dist.get_rank()
    value = round(torch.rand((), generator=generator(seed, rank)).item() * 100, 3)
    got = fn(value)
    return value, got


def check_max_over_ranks(fn) -> str:
    seed = new_seed()
    each_world(_trial, (fn, seed), seed=seed, judge_world=_largest_problem)
    return f"every rank returned the largest value on 1-4 ranks (seed {seed})"


def _largest_problem(values: list, n: int) -> str | None:
    inputs = [v for v, _ in values]
    for rank, (_, got) in enumerate(values):
        problem = number_problem(got, max(inputs), "the largest value", rel=FLOAT32_REL)
        if problem:
            return (f"the ranks held {inputs}; rank {rank}: {problem}."
                    f"{_diagnosis(got, inputs, rank)}")
    return None


def _diagnosis(got, inputs: list, rank: int) -> str:
    """What the wrong number is, when it is something recognisable."""
    if not isinstance(got, (int, float)) or isinstance(got, bool):
        return ""
    close = lambda x: abs(got - x) <= FLOAT32_REL * max(1.0, abs(x))  # noqa: E731
    if close(inputs[rank]):
        return " That is this rank's own value: the others' never reached it."
    if close(sum(inputs)):
        return " That is the sum of the values: all_reduce sums unless told otherwise (op=)."
    if close(sum(inputs) / len(inputs)):
        return " That is the mean of the values: keep the largest instead."
    return ""


EXERCISES = (
    Exercise(
        name="00.max_over_ranks",
        notebook="00_launching_from_jupyter",
        summary="max_over_ranks(value): the largest value held by any rank, on every rank",
        hint="every rank needs what the others hold: put your value in a tensor, and let one "
             "collective combine the ranks' tensors so that every rank keeps the largest "
             "(dist.ReduceOp.MAX); return a Python number.",
        recipe="t = torch.tensor([value]) (one element); dist.all_reduce(t, "
               "op=dist.ReduceOp.MAX) leaves the largest of all ranks' t in every rank's t; "
               "return t.item(), the Python float inside.",
        solution=max_over_ranks,
        checker=check_max_over_ranks,
    ),
)
