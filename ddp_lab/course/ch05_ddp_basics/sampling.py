"""Notebook 05b, section 2: sharding the data set with DistributedSampler, and evaluating it.

``DistributedSampler`` gives each rank every N-th index of one permutation that all ranks
compute alike (seeded by ``seed + epoch``), so the shards are disjoint and cover the data.
Two details matter: ``set_epoch`` must be called every epoch or the permutation never
changes, and a data set that does not divide by N is padded with repeated indices so that
all ranks run the same number of steps. Padding is harmless in training and wrong in
evaluation; the fix is an unpadded shard per rank and an all_reduce of (correct, total).
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch.utils.data import DistributedSampler

from ddp_lab.course.training import rank_device

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


def uneven_evaluation(grad_enabled: bool = False, batches: tuple[int, ...] = (3, 1)) -> int:
    """Worker: one training step of a DDP model with buffers (ToyModel + BatchNorm1d), then an
    evaluation loop *through the wrapper*, in ``eval()`` mode, where rank r runs
    ``batches[r % len(batches)]`` forwards; returns that count after a final barrier.

    DDP broadcasts the buffers in a forward only when the forward before it ran with grad
    enabled and gradient sync on (``require_forward_param_sync``, reset in ``_post_forward``,
    torch/nn/parallel/distributed.py). Under ``torch.no_grad()`` only the first evaluation
    forward broadcasts, so unequal counts finish; with grad enabled every forward does, and
    the rank with more batches waits in a broadcast its peers never join."""
    from ddp_lab.course.ch05_ddp_basics.basics import toy_with_buffers
    from ddp_lab.course.params import device_ids
    from torch.nn.parallel import DistributedDataParallel as DDP
    device = rank_device()
    torch.manual_seed(0)
    ddp_model = DDP(toy_with_buffers().to(device), device_ids=device_ids(device))
    ddp_model(torch.randn(8, 10, device=device)).sum().backward()
    ddp_model.eval()
    count = batches[dist.get_rank() % len(batches)]
    with torch.set_grad_enabled(grad_enabled):
        for _ in range(count):
            ddp_model(torch.randn(8, 10, device=device))
    dist.barrier()
    return count
