"""Notebook 00b's exercise: do all ranks hold the same weights? The same answer on every rank.

Live ranks step a model cell by cell, and the one invariant of data parallelism is that
every rank's weights stay identical. The check builds the same model on every rank (one
seed), then on some trials nudges one weight of one rank (a random rank, rank 0 included)
by a single float32 step (the next representable number): a sum, a mean or a tolerance
cannot see that, and an answer that only one rank knows, or that differs between ranks,
fails. The weights must come back untouched.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from ddp_lab.exercises.driver import WORLD_SIZES, generator, new_seed, run_ranks
from ddp_lab.exercises.driver import where as on
from ddp_lab.exercises.registry import Exercise, ExerciseFailed


def weights_agree(model: torch.nn.Module) -> bool:
    """Reference: every parameter in one vector v; one all_reduce(MAX) of [v, -v] gives each
    entry's largest and (negated) smallest value over the ranks. They are equal exactly when
    every rank holds the same weights, and every rank reads the same reduced tensor."""
    v = torch.cat([p.detach().reshape(-1).to(torch.float64) for p in model.parameters()])
    both = torch.cat([v, -v])
    dist.all_reduce(both, op=dist.ReduceOp.MAX)
    return torch.equal(both[:v.numel()], -both[v.numel():])


def _model(seed: int) -> torch.nn.Module:
    """The same weights on every rank; sizes only the seed value decides."""
    sizes = torch.randint(2, 6, (3,), generator=generator(seed)).tolist()
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(sizes[0], sizes[1]), torch.nn.Tanh(),
                               torch.nn.Linear(sizes[1], sizes[2]))


def _nudge(model: torch.nn.Module, seed: int) -> str:
    """One weight, chosen by the seed value, to the next float32 up: the smallest change
    there is."""
    params = list(model.named_parameters())
    pick = torch.randint(0, 10 ** 6, (2,), generator=generator(seed, 7)).tolist()
    name, param = params[pick[0] % len(params)]
    flat = param.data.view(-1)
    index = pick[1] % flat.numel()
    flat[index] = torch.nextafter(flat[index], torch.tensor(float("inf")))
    return f"{name}[{index}]"


def _trial(fn, seed: int, odd_rank: int | None):
    model = _model(seed)
    nudged = _nudge(model, seed) if dist.get_rank() == odd_rank else None
    before = [p.detach().clone() for p in model.parameters()]
    got = fn(model)
    kept = all(torch.equal(a, p) for a, p in zip(before, model.parameters()))
    return got, kept, nudged


def check_weights_agree(fn) -> str:
    seed = new_seed()
    for n in WORLD_SIZES:
        odd_ranks = [None] + ([int(torch.randint(0, n, (1,), generator=generator(seed, n)))]
                              if n > 1 else [])
        for odd_rank in odd_ranks:
            where = on(n, seed)
            _judge(run_ranks(_trial, n, (fn, seed, odd_rank), where=where), odd_rank, where)
    return (f"the same verdict on every rank, one float32 step told apart, on 1-4 ranks "
            f"(seed {seed})")


def _judge(results: list, odd_rank: int | None, where: str) -> None:
    expected = odd_rank is None
    held = ("every rank held the same weights" if expected else
            f"rank {odd_rank}'s {results[odd_rank][2]} was one float32 step above the others'")
    for rank, (got, kept, _) in enumerate(results):
        if not kept:
            raise ExerciseFailed(f"{where}: rank {rank}'s weights changed during your function: "
                                 "collectives work in place, so reduce a copy (a new tensor), "
                                 "never the parameters themselves.")
        if not isinstance(got, bool):
            raise ExerciseFailed(f"{where}: rank {rank} returned {type(got).__name__} "
                                 f"{got!r}; return a bool (bool(...) of a tensor comparison).")
    answers = [got for got, _, _ in results]
    if len(set(answers)) > 1:
        raise ExerciseFailed(f"{where}: {held}, and the ranks answered {answers}: every rank "
                             "must give the same answer, so each needs what all the others hold.")
    if answers[0] != expected:
        raise ExerciseFailed(f"{where}: {held}, yet every rank answered {answers[0]}. A sum, a "
                             "mean or a tolerance can hide a difference of one float32 step: "
                             "compare exactly.")


EXERCISES = (
    Exercise(
        name="00b.weights_agree",
        notebook="00b_live_ranks",
        summary="weights_agree(model): True on every rank exactly when all ranks hold the "
                "same weights",
        hint="one collective can give every rank the largest and the smallest value of each "
             "weight over all ranks (what is the MAX of -x?); the weights agree when those two "
             "are equal everywhere.",
        solution=weights_agree,
        checker=check_weights_agree,
    ),
)
