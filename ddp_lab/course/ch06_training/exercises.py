"""Notebook 06's exercise: the job's throughput from every rank's own count and time.

Each rank gets a random number of samples and a random time (a fresh seed per check), so
a constant or one rank's own rate cannot pass; the answer is compared with torch's
all_reduce (SUM of the samples, MAX of the times) on the same numbers.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from ddp_lab.exercises.driver import WORLD_SIZES, generator, new_seed, run_ranks
from ddp_lab.exercises.driver import where as on
from ddp_lab.exercises.registry import Exercise, ExerciseFailed


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
    got = fn(samples, seconds)
    total = torch.tensor([float(samples), float(seconds)], dtype=torch.float64)
    slowest = total.clone()
    dist.all_reduce(total, op=dist.ReduceOp.SUM)
    dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
    return (samples, seconds), got, total[0].item() / slowest[1].item()


def check_global_throughput(fn) -> str:
    seed = new_seed()
    for n in WORLD_SIZES:
        values = run_ranks(_trial, n, (fn, seed), where=on(n, seed))
        inputs = [pair for pair, _, _ in values]
        for rank, (_, got, expected) in enumerate(values):
            if not isinstance(got, (int, float)) or abs(got - expected) > 1e-6 * expected:
                raise ExerciseFailed(
                    f"{on(n, seed)}, (samples, seconds) per rank {inputs}: rank {rank} "
                    f"returned {got!r}, expected {expected:.2f} samples/s. Sum the samples "
                    "of all ranks and divide by the slowest rank's time (all_reduce with "
                    "SUM and with MAX); an average of the ranks' rates overstates it.")
    return f"the job's samples/s on every rank, 1-4 ranks (seed {seed})"


EXERCISES = (
    Exercise(
        name="06.global_throughput",
        notebook="06_ddp_training_cnn",
        summary="global_throughput(samples, seconds): the whole job's samples/s, on every rank",
        hint="two all_reduces: the samples with ReduceOp.SUM, the seconds with ReduceOp.MAX; "
             "divide.",
        solution=global_throughput,
        checker=check_global_throughput,
    ),
)
