"""Wrong answers to the exercises of notebook 04: the ones a learner really writes.

MUTANTS holds (exercise, wrong answer, a regex the rejection must match); test_mutations.py
checks every one with a single parametrized test. Data and functions only, no test here."""

from __future__ import annotations

import torch
import torch.distributed as dist

from ddp_lab.course.ch04_allreduce import exercises as ch04

# -- 04 --------------------------------------------------------------------------------------
def whole_tensor_to_everyone(tensor):
    rank, world = dist.get_rank(), dist.get_world_size()
    total = tensor.clone()
    for peer in range(world):
        if peer != rank:
            incoming = torch.empty_like(tensor)
            for request in (dist.isend(tensor, peer), dist.irecv(incoming, peer)):
                request.wait()
            total += incoming
    return total.chunk(world)[rank]


def builtin_reduce(tensor):
    total = tensor.clone()
    dist.all_reduce(total)
    return total.chunk(dist.get_world_size())[dist.get_rank()]


def ring_wrong_chunk(tensor):
    rank, world = dist.get_rank(), dist.get_world_size()
    chunks = [c.clone() for c in tensor.chunk(world)]
    for step in range(world - 1):  # unshifted: rank r ends with chunk r + 1
        outgoing, into = chunks[(rank - step) % world], chunks[(rank - step - 1) % world]
        incoming = torch.empty_like(into)
        for request in (dist.isend(outgoing, (rank + 1) % world),
                        dist.irecv(incoming, (rank - 1) % world)):
            request.wait()
        into += incoming
    return chunks[rank]


def root_sends_to_all(tensor, src):
    rank, data = dist.get_rank(), tensor.clone()
    if rank == src:
        for peer in range(dist.get_world_size()):
            if peer != src:
                dist.send(data, peer)
    else:
        dist.recv(data, src)
    return data


def chain(tensor, src):
    rank, world = dist.get_rank(), dist.get_world_size()
    data = tensor.clone()
    if (rank - src) % world:
        dist.recv(data, (rank - 1) % world)
    if (rank - src) % world < world - 1:
        dist.send(data, (rank + 1) % world)
    return data


def builtin_broadcast(tensor, src):
    data = tensor.clone()
    dist.broadcast(data, src)
    return data


def tree_rooted_at_zero(tensor, src):
    return ch04.tree_broadcast(tensor, 0)


MUTANTS = [
    ("04.reduce_scatter", whole_tensor_to_everyone, "the ring sends"),
    ("04.reduce_scatter", builtin_reduce, "dist.all_reduce is switched off"),
    ("04.reduce_scatter", ring_wrong_chunk, "summed over all ranks"),
    ("04.tree_broadcast", root_sends_to_all, r"took 3 rounds .*ceil\(log2 4\) = 2"),
    ("04.tree_broadcast", chain, "took 3 rounds"),
    ("04.tree_broadcast", builtin_broadcast, "dist.broadcast is switched off"),
    ("04.tree_broadcast", tree_rooted_at_zero, "should return rank"),
]
