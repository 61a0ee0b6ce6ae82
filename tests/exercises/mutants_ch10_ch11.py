"""Wrong answers to the exercises of notebooks 10 and 11: the ones a learner really writes.

MUTANTS holds (exercise, wrong answer, a regex the rejection must match); test_mutations.py
checks every one with a single parametrized test. Data and functions only, no test here."""

from __future__ import annotations

import re

import torch
import torch.distributed as dist
import torch.distributed.nn.functional as differentiable
import torch.nn.functional as F


# 10.zero1_step: wrong answers ---------------------------------------------------------------

def no_broadcast(params, owners, local_optimizer):
    if local_optimizer is not None:
        local_optimizer.step()


def broadcast_from_rank0(params, owners, local_optimizer):
    if local_optimizer is not None:
        local_optimizer.step()
    for p in params:
        dist.broadcast(p.data, src=0)


def forgets_the_step(params, owners, local_optimizer):
    for p, owner in zip(params, owners):
        dist.broadcast(p.data, src=owner)


def reduces_again(params, owners, local_optimizer):
    for p in params:
        dist.all_reduce(p.grad)
    if local_optimizer is not None:
        local_optimizer.step()


# 10.shard_gradient: wrong answers -----------------------------------------------------------

def _padded(g):
    return F.pad(g.flatten(), (0, (-g.numel()) % dist.get_world_size()))


def sums_instead_of_averaging(g):
    flat = _padded(g)
    out = torch.empty(flat.numel() // dist.get_world_size())
    dist.reduce_scatter_tensor(out, flat)
    return out


def keeps_own_gradient(g):
    return _padded(g).chunk(dist.get_world_size())[dist.get_rank()]


def forgets_padding(g):
    world = dist.get_world_size()
    out = torch.empty(g.numel() // world)
    dist.reduce_scatter_tensor(out, g.flatten())
    return out / world


def all_reduce_then_slice(g):
    flat = _padded(g)
    dist.all_reduce(flat)
    return flat.chunk(dist.get_world_size())[dist.get_rank()] / dist.get_world_size()


# 11.row_parallel: wrong answers -------------------------------------------------------------

def partial_only(x_slice, weight_slice, bias):
    return x_slice @ weight_slice.T + bias


def bias_on_every_rank(x_slice, weight_slice, bias):
    return differentiable.all_reduce(x_slice @ weight_slice.T + bias)


def gradients_summed_again(x_slice, weight_slice, bias):
    return differentiable.all_reduce(x_slice @ weight_slice.T) + bias


def detached_sum(x_slice, weight_slice, bias):
    total = (x_slice @ weight_slice.T).detach()
    dist.all_reduce(total)
    return total + bias


def averaged(x_slice, weight_slice, bias):
    partial = x_slice @ weight_slice.T
    dist.all_reduce(partial)
    return partial / dist.get_world_size() + bias


MUTANTS = [
    ("10.zero1_step", no_broadcast, re.escape("still holds its old value")),
    ("10.zero1_step", broadcast_from_rank0, re.escape("src=owners[i]")),
    ("10.zero1_step", forgets_the_step, re.escape("call local_optimizer.step()")),
    ("10.zero1_step", reduces_again, re.escape("dist.all_reduce is switched off")),
    ("10.shard_gradient", sums_instead_of_averaging, re.escape("divide by the world size")),
    ("10.shard_gradient", keeps_own_gradient, re.escape("never reduced across the ranks")),
    ("10.shard_gradient", forgets_padding, re.escape("raised RuntimeError")),
    ("10.shard_gradient", all_reduce_then_slice, re.escape("use dist.reduce_scatter_tensor")),
    ("11.row_parallel", partial_only, re.escape("all-reduce (sum) it")),
    ("11.row_parallel", bias_on_every_rank, re.escape("add it once")),
    ("11.row_parallel", gradients_summed_again, re.escape("backward is the identity")),
    ("11.row_parallel", detached_sum, re.escape("no gradient reached")),
    ("11.row_parallel", averaged, re.escape("their sum")),
]
