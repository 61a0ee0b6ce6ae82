"""Wrong answers to the exercises of notebooks 05, 05b and 06:
the ones a learner really writes.

MUTANTS holds (exercise, wrong answer, a regex the rejection must match); test_mutations.py
checks every one with a single parametrized test. Data and functions only, no test here."""

from __future__ import annotations

import math

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, DistributedSampler

from ddp_lab.course.ch05_ddp_basics import exercises_b as ch05


# -- 05 --------------------------------------------------------------------------------------
def padded_sampler(model, dataset):
    counts = torch.zeros(2)
    with torch.no_grad():
        for x, y in DataLoader(dataset, batch_size=4,
                               sampler=DistributedSampler(dataset, shuffle=False)):
            counts += torch.tensor([(model(x).argmax(dim=1) == y).sum().item(), len(y)])
    dist.all_reduce(counts)
    return (counts[0] / counts[1]).item()


def own_shard_accuracy(model, dataset):
    rank, world = dist.get_rank(), dist.get_world_size()
    x, y = dataset[list(range(rank, len(dataset), world))]
    with torch.no_grad():
        return (model(x).argmax(dim=1) == y).float().mean().item()


def mean_of_accuracies(model, dataset):
    t = torch.tensor([own_shard_accuracy(model, dataset)])
    dist.all_reduce(t)
    return (t / dist.get_world_size()).item()


def everything_everywhere(model, dataset):
    x, y = dataset.tensors
    with torch.no_grad():
        return (model(x).argmax(dim=1) == y).float().mean().item()


def builtin_sampler(n, epoch, seed):
    sampler = DistributedSampler(range(n), shuffle=True, seed=seed)
    sampler.set_epoch(epoch)
    return list(sampler)


def epoch_forgotten(n, epoch, seed):
    return ch05.sampler_shard(n, 0, seed)


def contiguous_blocks(n, epoch, seed):
    rank, world = dist.get_rank(), dist.get_world_size()
    order = torch.randperm(n, generator=torch.Generator().manual_seed(seed + epoch)).tolist()
    per = math.ceil(n / world)
    return (order * 2)[rank * per:(rank + 1) * per]


def no_padding(n, epoch, seed):
    order = torch.randperm(n, generator=torch.Generator().manual_seed(seed + epoch)).tolist()
    return order[dist.get_rank()::dist.get_world_size()]


# -- 06 --------------------------------------------------------------------------------------
def constant_rate(samples, seconds):
    return 200.0


def own_rate(samples, seconds):
    return samples / seconds


def mean_rate(samples, seconds):
    t = torch.tensor([samples / seconds])
    dist.all_reduce(t)
    return t.item() / dist.get_world_size()


def sum_over_mean_time(samples, seconds):
    t = torch.tensor([float(samples), float(seconds)], dtype=torch.float64)
    dist.all_reduce(t)
    return (t[0] / (t[1] / dist.get_world_size())).item()


# -- 05.average_gradients -------------------------------------------------------------------
def summed_not_averaged(model):
    for p in model.parameters():
        if p.grad is not None:
            dist.all_reduce(p.grad)


def rank0_gradients(model):
    for p in model.parameters():
        if p.grad is not None:
            dist.broadcast(p.grad, src=0)


def reduced_the_parameters(model):
    for p in model.parameters():
        dist.all_reduce(p.data)  # the weights instead of their gradients


def weights_only(model):
    for name, p in model.named_parameters():
        if p.grad is not None and name.endswith("weight"):
            dist.all_reduce(p.grad)
            p.grad /= dist.get_world_size()


MUTANTS = [
    ("05b.global_accuracy", padded_sampler, "pads the shards with repeated samples"),
    ("05b.global_accuracy", own_shard_accuracy, "same global fraction"),
    ("05b.global_accuracy", mean_of_accuracies, "divide once"),
    ("05b.global_accuracy", everything_everywhere, "evaluated the whole data set"),
    ("05b.sampler_shard", builtin_sampler, "DistributedSampler is switched off"),
    ("05b.sampler_shard", epoch_forgotten, "seed \\+ epoch"),
    ("05b.sampler_shard", contiguous_blocks, r"\[rank::world_size\]"),
    ("05b.sampler_shard", no_padding, "DistributedSampler's shard"),
    ("06.global_throughput", constant_rate, "slowest rank's time"),
    ("06.global_throughput", own_rate, "slowest rank's time"),
    ("06.global_throughput", mean_rate, "average of the ranks' rates"),
    ("06.global_throughput", sum_over_mean_time, "MAX"),
    ("05.average_gradients", summed_not_averaged, "divide by world_size"),
    ("05.average_gradients", rank0_gradients, "MEAN of the ranks' gradients"),
    ("05.average_gradients", reduced_the_parameters, "the parameters changed"),
    ("05.average_gradients", weights_only, "for every parameter that has a gradient"),
]
