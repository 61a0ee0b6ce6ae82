"""Notebook 08's exercise: ranks holding different numbers of batches stop together.

Each rank gets a random number of batches (a fresh seed per check; at least two ranks
differ), made by the checker and dealt to the ranks (a rank holds its own batches only, never
the others' counts), ``Join`` is switched off while the learner's loop runs, and every rank's
final weights are compared, in the checker, with one process that takes ``min(counts)`` steps
on the mean of every rank's loss: what DDP's averaged gradients amount to.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.algorithms.join import Join
from torch.nn.parallel import DistributedDataParallel as DDP

from ddp_lab.course.models import ToyModel
from ddp_lab.course.params import flat_params
from ddp_lab.exercises.builtins_off import refusing, replaced
from ddp_lab.exercises.driver import WORLD_SIZES, each_world, generator, new_seed
from ddp_lab.exercises.driver import where as on
from ddp_lab.exercises.registry import Exercise
from ddp_lab.exercises.sealed import deal

HANG_HINT = ("Ranks that run out of batches leave (or wait) while the others still "
             "all-reduce gradients. Every rank must take the same number of steps: agree on "
             "that number with a collective before the loop.")


def train_in_step(ddp_model, optimizer, batches) -> None:
    """Reference: agree on the number every rank can do (all_reduce MIN), then train
    exactly that many steps, like drop_last."""
    steps = torch.tensor(len(batches))
    dist.all_reduce(steps, op=dist.ReduceOp.MIN)
    for x, y in batches[:int(steps)]:
        optimizer.zero_grad()
        F.mse_loss(ddp_model(x), y).backward()
        optimizer.step()


def batch_counts(seed: int, world: int) -> list[int]:
    """Batches per rank: random, with the last rank always one more than the first."""
    counts = torch.randint(2, 6, (world,), generator=generator(seed, world)).tolist()
    if world > 1:
        counts[-1] = counts[0] + 1
    return counts


def uneven_batches(seed: int, rank: int, count: int) -> list[tuple]:
    """Rank ``rank``'s ``count`` batches of 4 samples: different on every rank."""
    g = generator(seed, rank, count)
    return [(torch.randn(4, 10, generator=g), torch.randn(4, 5, generator=g))
            for _ in range(count)]


def start_state(seed: int) -> dict:
    """The model every rank starts from, made by the checker (its own RNG left as it was)."""
    with torch.random.fork_rng():
        torch.manual_seed(seed % 1000)
        return ToyModel().state_dict()


def _trial(fn, dealt) -> torch.Tensor:
    """On each rank: its own start and batches (dealt: nothing else of the check is here),
    the learner's loop, and the weights it ends with."""
    state, batches = dealt.take()
    model = ToyModel()
    model.load_state_dict(state)
    ddp_model = DDP(model)
    optimizer = torch.optim.SGD(ddp_model.parameters(), lr=0.1)
    with replaced(Join, "__init__", refusing("Join", "Join would train the extra batches "
                                             "too; stop when the first rank runs out")):
        fn(ddp_model, optimizer, batches)
    return flat_params(ddp_model)


def reference_weights(state: dict, per_rank: list[list[tuple]]) -> torch.Tensor:
    """One process: ``min(counts)`` steps, each on the mean of every rank's loss."""
    model = ToyModel()
    model.load_state_dict(state)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(min(len(batches) for batches in per_rank)):
        optimizer.zero_grad()
        loss = sum(F.mse_loss(model(b[step][0]), b[step][1]) for b in per_rank) / len(per_rank)
        loss.backward()
        optimizer.step()
    return flat_params(model)


def check_stop_together(fn) -> str:
    seed = new_seed()
    state = start_state(seed)
    per_rank = {n: [uneven_batches(seed, r, c) for r, c in enumerate(batch_counts(seed, n))]
                for n in WORLD_SIZES}

    def judge_world(weights: list, n: int) -> str | None:
        counts = batch_counts(seed, n)
        expected = reference_weights(state, per_rank[n])
        for rank, got in enumerate(weights):
            if not torch.allclose(got, expected, rtol=1e-5, atol=1e-6):
                return (f"rank {rank}'s weights differ from {min(counts)} steps on every "
                        f"rank's batches (largest difference {(got - expected).abs().max():.2g}"
                        "). Train exactly min(counts) steps on every rank, one optimizer step "
                        "per batch.")
        return None

    each_world(_trial, lambda n: (fn, deal([(state, b) for b in per_rank[n]])), seed=seed,
               place=lambda n: f"{on(n, seed)} holding {batch_counts(seed, n)} batches",
               judge_world=judge_world, hang_hint=HANG_HINT)
    return f"every rank stopped with the first, same weights, on 1-4 ranks (seed {seed})"


EXERCISES = (
    Exercise(
        name="08.stop_together",
        notebook="08_when_it_breaks",
        summary="train_in_step(ddp_model, optimizer, batches): one step per batch, every "
                "rank stopping when the first runs out",
        hint="a rank cannot see how many batches the others hold, so the ranks must agree, "
             "before the loop, on how many steps every one of them can take; agreeing is a "
             "collective. Which dist.ReduceOp turns everyone's count into that number?",
        recipe="steps = torch.tensor(len(batches)); dist.all_reduce(steps, "
               "op=dist.ReduceOp.MIN); then for x, y in batches[:int(steps)]: "
               "optimizer.zero_grad(); F.mse_loss(ddp_model(x), y).backward(); "
               "optimizer.step().",
        solution=train_in_step,
        checker=check_stop_together,
    ),
)
