"""Notebook 05b's exercises: a global accuracy that counts every sample once, and a
DistributedSampler's shard computed by hand.

The accuracy's checker builds a random classifier and a data set whose size no world size
divides (a fresh seed per check), counts the samples the model's forward sees on each rank
and the collectives each rank issues (at the dispatcher: any form counts), and compares
with one process's accuracy, computed in the checker's process: on several ranks, a rank
that never communicated cannot know the others' counts. Every rank holds the whole data set
and the same model (the exercise says so), so what a rank evaluated is told by its model's
forward, counted in ``forward`` itself (``model(x)`` and ``model.forward(x)`` alike); a rank
that redoes the model's arithmetic from its weights, around forward, and sends a collective
of nothing is beyond what any count can see. The shard's checker switches
``DistributedSampler`` off while the learner's code runs and compares, in its own process,
with DistributedSampler's shards for each rank, on data set sizes that no world size
divides and sizes smaller than the world (ranks whose whole shard is padding).
"""

from __future__ import annotations

import math

import torch
import torch.distributed as dist
import torch.utils.data
from torch import nn
from torch.utils.data import TensorDataset

from ddp_lab.course.collective_trace import CollectiveTrace
from ddp_lab.exercises.builtins_off import replaced, refusing
from ddp_lab.exercises.driver import WORLD_SIZES, each_world, generator, new_seed, number_problem
from ddp_lab.exercises.driver import where as on
from ddp_lab.exercises.registry import Exercise, ExerciseFailed


# -- 05b.global_accuracy ----------------------------------------------------------------------
def global_accuracy(model: nn.Module, dataset) -> float:
    """Reference: an unpadded strided shard per rank, then the (correct, total) counts summed
    across ranks and divided once: sums add up across ranks, accuracies do not."""
    rank, world = dist.get_rank(), dist.get_world_size()
    x, y = dataset[list(range(rank, len(dataset), world))]  # no padding
    counts = torch.zeros(2)
    with torch.no_grad():
        if len(y):
            counts += torch.tensor([(model(x).argmax(dim=1) == y).sum().item(), len(y)])
    dist.all_reduce(counts)
    return (counts[0] / counts[1]).item()


def accuracy_problem(n: int, seed: int) -> tuple[nn.Module, TensorDataset]:
    """A random linear classifier and ``n`` samples it gets partly wrong (odd indices from 3
    on), its first samples (the ones DistributedSampler repeats as padding) right: so
    padding changes the accuracy."""
    g = generator(seed, n)
    model = nn.Linear(4, 3)
    with torch.no_grad():
        model.weight.copy_(torch.randn(3, 4, generator=g))
        model.bias.zero_()
        x = torch.randn(n, 4, generator=g)
        predicted = model(x).argmax(dim=1)
    wrong = torch.tensor([i >= 3 and i % 2 == 1 for i in range(n)])
    return model, TensorDataset(x, torch.where(wrong, (predicted + 1) % 3, predicted))


def _accuracy_trial(fn, model: nn.Module, dataset) -> tuple:
    """On a rank: the learner's accuracy, how many samples its model's forward saw (counted
    in ``forward`` itself, so ``model(x)`` and ``model.forward(x)`` both count) and how many
    collectives moved data."""
    seen = [0]
    forward = model.forward

    def counted(x):
        seen[0] += x.shape[0] if x.dim() > 1 else 1  # a batch, or one sample
        return forward(x)

    model.forward = counted
    with CollectiveTrace() as trace:
        got = fn(model, dataset)
    return got, seen[0], len(trace.moving_data())


def check_global_accuracy(fn) -> str:
    seed = new_seed()
    sizes = {world: world * (3 + seed % 3) + 1 for world in WORLD_SIZES}  # no world > 1 divides
    problems = {world: accuracy_problem(n, seed) for world, n in sizes.items()}
    each_world(_accuracy_trial, lambda world: (fn, *problems[world]), seed=seed,
               judge_world=lambda values, world: _judge(values, _accuracy(*problems[world]),
                                                        sizes[world], world, seed))
    return f"the whole data set's accuracy, each sample once, on 1-4 ranks (seed {seed})"


def _accuracy(model, dataset) -> float:
    x, y = dataset.tensors
    with torch.no_grad():
        return (model(x).argmax(dim=1) == y).float().mean().item()


def _judge(values: list[tuple], expected: float, n: int, world: int, seed: int) -> None:
    accuracies = [acc for acc, _, _ in values]
    seen = [count for _, count, _ in values]
    where = f"{on(world, seed)} with {n} samples"
    problem = _sharding_problem(seen, n, world)
    if problem:
        raise ExerciseFailed(f"{where}, the model saw {seen} samples on the ranks: {problem}")
    for rank, (got, _, collectives) in enumerate(values):
        if world > 1 and not collectives:
            raise ExerciseFailed(
                f"{where}, rank {rank} returned {got!r} without a single collective. It "
                "evaluated only its share, so the other ranks' counts can reach it only "
                "through communication (and a result that needs none did not come from "
                "evaluating one share).")
        if isinstance(got, bool) or not isinstance(got, (int, float)):
            raise ExerciseFailed(f"{where}, rank {rank}: "
                                 f"{number_problem(got, expected, 'the accuracy')}")
    if any(abs(a - expected) > 1e-6 for a in accuracies):
        raise ExerciseFailed(
            f"{where}, the accuracy over the whole data set is {expected:.4f}, but the ranks "
            f"returned {accuracies}. Every rank should return the same global fraction (not "
            "a percentage, not its own shard's accuracy): all_reduce the (correct, total) "
            "counts and divide once.")


def _sharding_problem(seen: list[int], n: int, world: int) -> str | None:
    if world > 1 and max(seen) == n:
        return "a rank evaluated the whole data set; each rank should take only its share"
    if sum(seen) > n:
        return (f"{sum(seen)} in all for {n} samples. DistributedSampler pads the shards with "
                "repeated samples; shard without padding, e.g. range(rank, n, world_size)")
    if sum(seen) < n:
        return f"{sum(seen)} in all for {n} samples: some were never evaluated"
    if max(seen) > math.ceil(n / world):
        return "the shares are uneven; give every rank about n / world_size samples"
    return None


# -- 05b.sampler_shard --------------------------------------------------------------------------
def sampler_shard(n: int, epoch: int, seed: int) -> list[int]:
    """Reference: what DistributedSampler(shuffle=True, seed=seed) gives this rank in
    ``epoch``: one permutation that every rank draws alike from ``seed + epoch`` (no
    communication needed), padded by repeating its start to a multiple of the world size,
    then every world_size-th index from this rank's."""
    rank, world = dist.get_rank(), dist.get_world_size()
    order = torch.randperm(n, generator=torch.Generator().manual_seed(seed + epoch)).tolist()
    total = math.ceil(n / world) * world
    while len(order) < total:
        order += order[:total - len(order)]
    return order[rank:total:world]


def _shard_trial(fn, cases: list[tuple[int, int, int]]) -> list:
    """On a rank: the learner's shard for each (n, epoch, seed) in ``cases``, with
    DistributedSampler switched off."""
    sampler_class = torch.utils.data.DistributedSampler
    off = refusing("DistributedSampler", "compute the shard yourself")
    # Off on the class itself, so a name imported before the check is off too.
    with replaced(sampler_class, "__init__", off), replaced(sampler_class, "__iter__", off):
        return [fn(n, epoch, seed) for n, epoch, seed in cases]


def sampler_shards(n: int, epoch: int, seed: int, world: int) -> list[list[int]]:
    """DistributedSampler's shard of every rank, in the checker's process (it takes the
    world size and rank as arguments, so it needs no process group)."""
    shards = []
    for rank in range(world):
        sampler = torch.utils.data.DistributedSampler(range(n), num_replicas=world, rank=rank,
                                                      shuffle=True, seed=seed)
        sampler.set_epoch(epoch)
        shards.append(list(sampler))
    return shards


def shard_cases(seed: int, world: int) -> list[tuple[int, int, int]]:
    """(n, epoch, seed) for one world size: an n that the world size does not divide, and
    (on several ranks) an n smaller than the world, where some ranks get only padding."""
    g = generator(seed, world)
    epoch, sampler_seed = int(torch.randint(0, 6, (1,), generator=g)), seed % 1000
    n = world * int(torch.randint(1, 4, (1,), generator=g)) + 1 + int(
        torch.randint(0, max(world - 1, 1), (1,), generator=g))
    smaller = sorted({1, world - 1} - {0})  # 1: most ranks get only the one sample, repeated
    return [(n, epoch, sampler_seed)] + [(k, epoch + 1, sampler_seed) for k in smaller]


def check_sampler_shard(fn) -> str:
    seed = new_seed()
    each_world(_shard_trial, lambda world: (fn, shard_cases(seed, world)), seed=seed,
               judge_world=lambda values, world: _judge_shards(values, world, seed))
    return (f"the same shards as DistributedSampler on 1-4 ranks, with n not divisible by "
            f"the world and n below it (seed {seed})")


def _judge_shards(values: list, world: int, seed: int) -> None:
    for case_index, (n, epoch, sampler_seed) in enumerate(shard_cases(seed, world)):
        expected = sampler_shards(n, epoch, sampler_seed, world)
        for rank, results in enumerate(values):
            _judge_shard((results[case_index], expected[rank]), f"{on(world, seed)}, n={n}, "
                         f"epoch={epoch}, seed={sampler_seed}: rank {rank}")


def _judge_shard(result: tuple, where: str) -> None:
    got, expected = result
    if not isinstance(got, (list, tuple)):
        raise ExerciseFailed(f"{where} should get the list {expected}, got "
                             f"{type(got).__name__} {got!r}: return a list of ints "
                             "(tensor.tolist() turns a tensor into one).")
    if [int(i) for i in got] != expected:
        raise ExerciseFailed(
            f"{where} should get {expected} (DistributedSampler's shard), got {got!r}. "
            "One permutation from torch.Generator().manual_seed(seed + epoch), padded "
            "with its own start to a multiple of world_size, then [rank::world_size].")


EXERCISES = (
    Exercise(
        name="05b.global_accuracy",
        notebook="05b_ddp_data_and_checkpoints",
        summary="my_global_accuracy(model, dataset): the whole data set's accuracy, each "
                "rank evaluating only its share",
        hint="an accuracy is a ratio: averaging the ranks' ratios is wrong when their "
             "shares differ in size, but counts add up across ranks. Take your share without "
             "padding (DistributedSampler repeats samples), communicate counts, divide once.",
        recipe="rank, N = dist.get_rank(), dist.get_world_size(); x, y = dataset["
               "list(range(rank, len(dataset), N))]; count the correct predictions of "
               "model(x) (argmax over dim 1) under torch.no_grad(); put (correct, len(y)) "
               "in one float tensor, dist.all_reduce it (SUM), and return "
               "(correct / total).item() on every rank.",
        solution=global_accuracy,
        checker=check_global_accuracy,
        answered_by=("ddp_lab.course.ch05_ddp_basics.sampling:evaluate_three_ways",),
    ),
    Exercise(
        name="05b.sampler_shard",
        notebook="05b_ddp_data_and_checkpoints",
        summary="my_shard(n, epoch, seed): this rank's indices, as DistributedSampler "
                "(shuffle=True) gives them",
        hint="every rank draws the same permutation from the same seed (no communication); "
             "set_epoch changes that seed. Read DistributedSampler.__iter__ in "
             "torch/utils/data/distributed.py: it pads to a multiple of the world size, then "
             "takes every world_size-th index.",
        recipe="order = torch.randperm(n, generator=torch.Generator().manual_seed(seed + "
               "epoch)).tolist(); total = ceil(n / N) * N; while len(order) < total: order "
               "+= order[:total - len(order)] (repeats the start, also when n < N); return "
               "order[rank:total:N].",
        solution=sampler_shard,
        checker=check_sampler_shard,
    ),
)
