"""Notebook 00's exercise: the largest value over all ranks, on every rank.

Each rank gets a different random number (a fresh seed per check), so no closed form of
the rank or the world size can pass; on one world size every number is negative, so a
maximum that starts at 0 fails. The checker makes every rank's number and hands each rank
only its own (:func:`~ddp_lab.exercises.sealed.deal`); the largest is known only here, in
the checker's process, where each rank's answer is compared with it. Any collective, reached
any way, may do it: the check judges the number each rank returns, at a tolerance that a
float32 tensor (``torch.tensor([value])``'s default dtype) meets, so the first hint works as
written.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from ddp_lab.exercises.driver import WORLD_SIZES, each_world, generator, new_seed, number_problem
from ddp_lab.exercises.registry import Exercise
from ddp_lab.exercises.sealed import deal

# float32 keeps 24 bits of mantissa: a value rounded through it is off by at most 2**-24 of
# itself (6e-8); a wrong answer (another rank's value, a sum, a mean) is off by far more.
FLOAT32_REL = 1e-6


def max_over_ranks(value: float) -> float:
    """Reference: every rank contributes its value; MAX keeps the largest, everywhere."""
    t = torch.tensor([float(value)], dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return t.item()


def rank_values(seed: int, n: int) -> list[float]:
    """One number per rank, in [-100, 100) with three decimals; on one world size of 2-4
    ranks (the check's seed picks which) all of them negative, so a maximum started at 0, or over a tensor of
    zeros with one slot per rank, says 0 (on 1 rank such a tensor holds the value alone)."""
    values = [round(torch.rand((), generator=generator(seed, n, rank)).item() * 200 - 100, 3)
              for rank in range(n)]
    if n == negative_world(seed):
        values = [-abs(v) - 0.5 for v in values]
    return values


def negative_world(seed: int) -> int:
    return 2 + seed % 3


def _trial(fn, dealt) -> float:
    """The learner's answer for this rank's number, the only one this process sees."""
    return fn(dealt.take())


def check_max_over_ranks(fn) -> str:
    seed = new_seed()
    inputs = {n: rank_values(seed, n) for n in WORLD_SIZES}
    each_world(_trial, lambda n: (fn, deal(inputs[n])), seed=seed,
               judge_world=lambda got, n: _largest_problem(inputs[n], got))
    return (f"every rank returned the largest value on 1-4 ranks, all of them negative on "
            f"{negative_world(seed)} (seed {seed})")


def _largest_problem(inputs: list, answers: list) -> str | None:
    for rank, got in enumerate(answers):
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
    if got == 0 and max(inputs) < 0:
        return (" Every value was negative: a maximum that starts at 0 (or from a tensor of "
                "zeros) never goes below it. Start from the values themselves.")
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
