"""Notebook 06's exercise: the job's throughput from every rank's own count and time.

Each rank gets a random number of samples and a random time (a fresh seed per check), so
a constant or one rank's own rate cannot pass; the answer is compared with torch's
all_reduce (SUM of the samples, MAX of the times) on the same numbers, and on several ranks
the learner's code must have communicated (collectives counted at the dispatcher, so any
form counts): no rank knows the others' numbers otherwise.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from ddp_lab.course.collective_trace import CollectiveTrace
from ddp_lab.exercises.driver import each_world, generator, new_seed, number_problem
from ddp_lab.exercises.registry import Exercise


def global_throughput(samples: int, seconds: float) -> float:
    """Reference: the job's samples/s = all ranks' samples / the slowest rank's time (the
    others waited for it at every gradient all-reduce)."""
    total = torch.tensor([float(samples)], dtype=torch.float64)
    slowest = torch.tensor([float(seconds)], dtype=torch.float64)
    dist.all_reduce(total, op=dist.ReduceOp.SUM)
    dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
    return total.item() / slowest.item()


def _inputs(seed: int, rank: int) -> tuple[int, float]:
    g = generator(seed, rank)
    return int(torch.randint(50, 500, (1,), generator=g)), round(
        1.0 + 3.0 * torch.rand((), generator=g).item(), 2)


def _trial(fn, seed: int) -> tuple:
    samples, seconds = _inputs(seed, dist.get_rank())
    with CollectiveTrace() as trace:
        got = fn(samples, seconds)
    total = torch.tensor([float(samples), float(seconds)], dtype=torch.float64)
    slowest = total.clone()
    dist.all_reduce(total, op=dist.ReduceOp.SUM)
    dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
    return (samples, seconds), got, total[0].item() / slowest[1].item(), len(trace.moving_data())


def check_global_throughput(fn) -> str:
    seed = new_seed()
    each_world(_trial, (fn, seed), seed=seed, judge_world=_throughput_problem)
    return f"the job's samples/s on every rank, 1-4 ranks (seed {seed})"


def _throughput_problem(values: list, n: int) -> str | None:
    inputs = [pair for pair, _, _, _ in values]
    for rank, (_, got, expected, collectives) in enumerate(values):
        if isinstance(got, bool) or not isinstance(got, (int, float)):
            return f", rank {rank}: {number_problem(got, expected, 'samples/s')}"
        if n > 1 and not collectives:
            return (f", rank {rank} returned {got!r} without a single collective: it cannot "
                    "know the other ranks' samples and times without asking them.")
        if abs(got - expected) > 1e-6 * expected:
            return (f", (samples, seconds) per rank {inputs}: rank {rank} returned {got!r}, "
                    f"expected {expected:.2f} samples/s. Sum the samples of all ranks and "
                    "divide by the slowest rank's time (all_reduce with SUM and with MAX); an "
                    "average of the ranks' rates overstates it.")
    return None


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
