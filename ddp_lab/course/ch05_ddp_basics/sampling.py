"""Notebook 05, part 4: sharding the data set with DistributedSampler, and evaluating it.

``DistributedSampler`` gives each rank every N-th index of one permutation that all ranks
compute alike (seeded by ``seed + epoch``), so the shards are disjoint and cover the data.
Two details matter: ``set_epoch`` must be called every epoch or the permutation never
changes, and a data set that does not divide by N is padded with repeated indices so that
all ranks run the same number of steps. Padding is harmless in training and wrong in
evaluation; the fix is an unpadded shard per rank and an all_reduce of (correct, total).
"""

from __future__ import annotations

import math

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

from ddp_lab.course.training import evaluate, rank_device

EVAL_WAYS = ("padded", "drop_last", "unpadded")
EXAMPLE_CORRECT = (True, True, False, True, False, True, True, False, False, False)  # 50%


def sampler_indices(n: int = 10, epochs: int = 3, *, set_epoch: bool = True, shuffle: bool = True,
                    seed: int = 0, seed_by_rank: bool = False,
                    drop_last: bool = False) -> list[list[int]]:
    """Worker: the indices this rank's DistributedSampler yields in each epoch.
    ``seed_by_rank`` is the mistake of giving each rank its own sampler seed."""
    rank = dist.get_rank()
    sampler = DistributedSampler(range(n), shuffle=shuffle, drop_last=drop_last,
                                 seed=seed + rank if seed_by_rank else seed)
    orders = []
    for epoch in range(epochs):
        if set_epoch:
            sampler.set_epoch(epoch)  # without it every epoch repeats epoch 0's order
        orders.append(list(sampler))
    return orders


def coverage(shards: list[list[int]], n: int) -> list[int]:
    """How many times each of the ``n`` samples is visited over all ranks' shards:
    all ones means disjoint and complete."""
    counts = [0] * n
    for indices in shards:
        for i in indices:
            counts[i] += 1
    return counts


def eval_indices(n: int, how: str) -> list[int]:
    """This rank's evaluation indices, three ways: DistributedSampler as in training
    (``padded``), with ``drop_last=True``, or a strided shard without padding."""
    rank, world = dist.get_rank(), dist.get_world_size()
    if how == "unpadded":
        return list(range(rank, n, world))
    if how not in EVAL_WAYS:
        raise ValueError(f"how must be one of {EVAL_WAYS}, not {how!r}")
    return list(DistributedSampler(range(n), shuffle=False, drop_last=how == "drop_last"))


def evaluate_three_ways(correct=EXAMPLE_CORRECT) -> dict:
    """Worker: accuracy over samples whose correctness is given, sharded each EVAL_WAYS way:
    this rank's indices and counts, and the global accuracy after an all_reduce of
    (correct, total)."""
    device = rank_device()  # NCCL reduces GPU tensors only
    results = {}
    for how in EVAL_WAYS:
        indices = eval_indices(len(correct), how)
        local = [float(sum(correct[i] for i in indices)), float(len(indices))]
        counts = torch.tensor(local, device=device)
        dist.all_reduce(counts)
        results[how] = {"indices": indices, "local": local,
                        "accuracy": (counts[0] / counts[1]).item()}
    return results


def exercise_problem(n: int = 13, seed: int = 0) -> tuple[nn.Module, TensorDataset]:
    """A fixed linear classifier and a data set it gets partly wrong (odd indices from 3 on),
    with its first samples, the ones DistributedSampler repeats as padding, right: so
    padding changes the accuracy."""
    gen = torch.Generator().manual_seed(seed)
    model = nn.Linear(4, 3)
    with torch.no_grad():
        model.weight.copy_(torch.randn(3, 4, generator=gen))
        model.bias.zero_()
        x = torch.randn(n, 4, generator=gen)
        predicted = model(x).argmax(dim=1)
    wrong = torch.tensor([i >= 3 and i % 2 == 1 for i in range(n)])
    labels = torch.where(wrong, (predicted + 1) % 3, predicted)
    return model, TensorDataset(x, labels)


def single_process_accuracy(model: nn.Module, dataset) -> float:
    """The reference: every sample once, in one process."""
    x, y = dataset.tensors
    with torch.no_grad():
        return (model(x).argmax(dim=1) == y).float().mean().item()


def run_counting_samples(fn, model, dataset) -> tuple:
    """Worker: the learner's ``fn(model, dataset)`` with a hook that counts the samples the
    model sees on this rank, so the checker knows whether the work was split."""
    seen = [0]

    def count(module, args, out):
        seen[0] += out.shape[0] if out.dim() > 1 else 1  # a batch, or one sample

    model.register_forward_hook(count)
    return fn(model, dataset), seen[0]


def check_global_accuracy(fn, world_sizes=(2, 3, 4), sizes=(13, 10)) -> str:
    """The exercise's checker: ``fn(model, dataset)`` runs on real ranks; every rank must
    return the accuracy over the whole data set (a fraction in [0, 1]) while its model saw
    only its own share, each sample once over all ranks."""
    import ddp_lab
    for n in sizes:
        model, dataset = exercise_problem(n)
        expected = single_process_accuracy(model, dataset)
        for world in world_sizes:
            # gloo even where GPUs exist: the model and data are on the CPU
            res = ddp_lab.run(run_counting_samples, world_size=world, backend="gloo",
                              args=(fn, model, dataset), timeout=30, echo=False)
            _judge(res.values, expected, n, world)
    return f"passed: {len(sizes)} data sets on {', '.join(map(str, world_sizes))} ranks"


def _judge(values: list[tuple], expected: float, n: int, world: int) -> None:
    accuracies = [float(acc) for acc, _ in values]
    seen = [count for _, count in values]
    where = f"with {n} samples on {world} ranks"
    problem = _sharding_problem(seen, n, world)
    if problem:
        raise AssertionError(f"{where} the model saw {seen} samples on the ranks: {problem}")
    if any(abs(acc - expected) > 1e-6 for acc in accuracies):
        raise AssertionError(
            f"{where} the accuracy over the whole data set is {expected:.4f}, but the ranks "
            f"returned {[round(a, 4) for a in accuracies]}. Every rank should return the "
            "same global fraction (not a percentage, not its own shard's accuracy): "
            "all_reduce the (correct, total) counts and divide once.")


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


def strided_accuracy(model: nn.Module, dataset) -> float:
    """A correct global accuracy (the exercise's reference): ``ddp_lab.course.training.evaluate``,
    an unpadded strided shard with counts summed across ranks, as a fraction."""
    return evaluate(model, dataset, torch.device("cpu")) / 100


def padded_accuracy(model: nn.Module, dataset, batch_size: int = 4) -> float:
    """The tempting wrong answer: the training-style DistributedSampler (padded)."""
    sampler = DistributedSampler(dataset, shuffle=False)
    return _all_reduced_accuracy(model, DataLoader(dataset, batch_size=batch_size,
                                                   sampler=sampler))


def _all_reduced_accuracy(model: nn.Module, loader) -> float:
    counts = torch.zeros(2)  # (correct, total): sums are what all_reduce can add up
    with torch.no_grad():
        for x, y in loader:
            counts += torch.tensor([(model(x).argmax(dim=1) == y).sum().item(), len(y)])
    dist.all_reduce(counts)
    return (counts[0] / counts[1]).item()
