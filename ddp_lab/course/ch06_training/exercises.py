"""Notebook 06's exercise: the job's throughput from every rank's own count and time.

The checker's process makes every rank's random number of samples and random time (a fresh
seed per check) and hands each rank only its own (``sealed.deal``), so a constant, one
rank's own rate, or a dummy collective cannot pass: no rank can know the others' numbers
but by communicating. The answer is compared, in the checker's process, with what an
all_reduce with SUM of the samples and one with MAX of the times give (the total over the
slowest time); on several ranks the learner's code must have communicated (collectives
counted at the dispatcher, so any form counts).
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from ddp_lab.course.collective_trace import CollectiveTrace
from ddp_lab.exercises.driver import WORLD_SIZES, each_world, generator, new_seed, number_problem
from ddp_lab.exercises.registry import Exercise
from ddp_lab.exercises.sealed import deal


def global_throughput(samples: int, seconds: float) -> float:
    """Reference: the job's samples/s = all ranks' samples / the slowest rank's time (the
    others waited for it at every gradient all-reduce)."""
    total = torch.tensor([float(samples)], dtype=torch.float64)
    slowest = torch.tensor([float(seconds)], dtype=torch.float64)
    dist.all_reduce(total, op=dist.ReduceOp.SUM)
    dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
    return total.item() / slowest.item()


def throughput_inputs(seed: int, world: int) -> list[tuple[int, float]]:
    """Every rank's (samples, seconds), made in the checker's process."""
    found = []
    for rank in range(world):
        g = generator(seed, rank)
        found.append((int(torch.randint(50, 500, (1,), generator=g)),
                      round(1.0 + 3.0 * torch.rand((), generator=g).item(), 2)))
    return found


def _trial(fn, dealt) -> tuple:
    """On a rank: its own numbers only; the learner's answer and how many collectives moved
    data."""
    samples, seconds = dealt.take()
    with CollectiveTrace() as trace:
        got = fn(samples, seconds)
    return got, len(trace.moving_data())


def job_throughput(inputs: list[tuple[int, float]]) -> float:
    """The job's samples/s: every rank's samples over the slowest rank's time (what an
    all_reduce with SUM and one with MAX give every rank)."""
    return sum(samples for samples, _ in inputs) / max(seconds for _, seconds in inputs)


def check_global_throughput(fn) -> str:
    seed = new_seed()
    inputs = {n: throughput_inputs(seed, n) for n in WORLD_SIZES}
    each_world(_trial, lambda n: (fn, deal(inputs[n])), seed=seed,
               judge_world=lambda values, n: _throughput_problem(values, inputs[n]))
    return f"the job's samples/s on every rank, 1-4 ranks (seed {seed})"


def _throughput_problem(values: list, inputs: list) -> str | None:
    expected = job_throughput(inputs)
    for rank, (got, collectives) in enumerate(values):
        if isinstance(got, bool) or not isinstance(got, (int, float)):
            return f", rank {rank}: {number_problem(got, expected, 'samples/s')}"
        if len(inputs) > 1 and not collectives:
            return (f", rank {rank} returned {got!r} without a single collective: it cannot "
                    "know the other ranks' samples and times without asking them.")
        if abs(got - expected) > 1e-6 * expected and _from_own_numbers(got, inputs[rank],
                                                                      len(inputs)):
            return (f", (samples, seconds) per rank {inputs}: rank {rank} returned {got!r}, "
                    f"which its own {inputs[rank]} give alone (its rate, or N times it): the "
                    "collectives it issued did not bring it the other ranks' numbers. "
                    f"Expected {expected:.2f} samples/s: all_reduce the samples with SUM and "
                    "the seconds with MAX, and use what comes back.")
        if abs(got - expected) > 1e-6 * expected:
            return (f", (samples, seconds) per rank {inputs}: rank {rank} returned {got!r}, "
                    f"expected {expected:.2f} samples/s. Sum the samples of all ranks and "
                    "divide by the slowest rank's time (all_reduce with SUM and with MAX); an "
                    "average of the ranks' rates overstates it.")
    return None


def _from_own_numbers(got: float, own: tuple[int, float], world: int) -> bool:
    """Whether ``got`` is what one rank's own numbers give without the others': its rate,
    or the world size times it (a total guessed from one rank)."""
    rate = own[0] / own[1]
    return world > 1 and any(abs(got - guess) <= 1e-6 * guess for guess in (rate, world * rate))


EXERCISES = (
    Exercise(
        name="06.global_throughput",
        notebook="06_ddp_training_cnn",
        summary="global_throughput(samples, seconds): the whole job's samples/s, on every rank",
        hint="the job's rate is its total samples over the time it took, and the job took "
             "as long as its slowest rank. Each of the two numbers needs a collective that "
             "combines the ranks' values in its own way (see dist.ReduceOp).",
        recipe="samples_t = torch.tensor([float(samples)], dtype=torch.float64); "
               "seconds_t likewise; dist.all_reduce(samples_t, op=dist.ReduceOp.SUM); "
               "dist.all_reduce(seconds_t, op=dist.ReduceOp.MAX); return "
               "(samples_t / seconds_t).item().",
        solution=global_throughput,
        checker=check_global_throughput,
    ),
)
