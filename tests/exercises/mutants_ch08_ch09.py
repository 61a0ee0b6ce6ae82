"""Wrong answers to the exercises of notebooks 08, 08b, 09 and 09b:
the ones a learner really writes.

MUTANTS holds (exercise, wrong answer, a regex the rejection must match); test_mutations.py
checks every one with a single parametrized test. Data and functions only, no test here."""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.algorithms.join import Join


# -- 08 --------------------------------------------------------------------------------------
def plain_loop(ddp_model, optimizer, batches):
    for x, y in batches:
        optimizer.zero_grad()
        F.mse_loss(ddp_model(x), y).backward()
        optimizer.step()


def agreed_on_max(ddp_model, optimizer, batches):
    steps = torch.tensor(len(batches))
    dist.all_reduce(steps, op=dist.ReduceOp.MAX)
    plain_loop(ddp_model, optimizer, batches[:int(steps)])


def joined(ddp_model, optimizer, batches):
    with Join([ddp_model]):
        plain_loop(ddp_model, optimizer, batches)


def one_step_short(ddp_model, optimizer, batches):
    steps = torch.tensor(len(batches))
    dist.all_reduce(steps, op=dist.ReduceOp.MIN)
    plain_loop(ddp_model, optimizer, batches[:int(steps) - 1])


# -- 09 --------------------------------------------------------------------------------------
def everyone_sum(value, local_world_size):
    t = torch.tensor([float(value)], dtype=torch.float64)
    dist.all_reduce(t)
    return t.item()


def rank_sum_closed_form(value, local_world_size):
    node = dist.get_rank() // local_world_size
    return float(sum(range(node * local_world_size, (node + 1) * local_world_size)))


def strided_nodes(value, local_world_size):
    world = dist.get_world_size()
    nodes = world // local_world_size
    groups = [dist.new_group(list(range(g, world, nodes))) for g in range(nodes)]
    t = torch.tensor([float(value)], dtype=torch.float64)
    dist.all_reduce(t, group=groups[dist.get_rank() % nodes])
    return t.item()


def flat_all_reduce(tensor, local_world_size):
    out = tensor.clone()
    dist.all_reduce(out)
    return out


def node_only(tensor, local_world_size):
    world, rank = dist.get_world_size(), dist.get_rank()
    groups = [dist.new_group(list(range(f, f + local_world_size)))
              for f in range(0, world, local_world_size)]
    out = tensor.clone()
    dist.all_reduce(out, group=groups[rank // local_world_size])
    return out


def all_ranks_in_one_group(tensor, local_world_size):
    group = dist.new_group(list(range(dist.get_world_size())))
    out = tensor.clone()
    dist.all_reduce(out, group=group)
    return out


def leaders_never_broadcast(tensor, local_world_size):
    world, rank = dist.get_world_size(), dist.get_rank()
    nodes = [dist.new_group(list(range(f, f + local_world_size)))
             for f in range(0, world, local_world_size)]
    leaders = dist.new_group(list(range(0, world, local_world_size)))
    leader, out = rank - rank % local_world_size, tensor.clone()
    dist.reduce(out, dst=leader, group=nodes[rank // local_world_size])
    if rank == leader:
        dist.all_reduce(out, group=leaders)
    return out


# -- 08b.first_unjoined ---------------------------------------------------------------------
def shortest_record(records):
    short = min(records, key=lambda rank: len(records[rank]))
    seq, name = records[short][-1]
    if all(len(entries) == len(records[short]) for entries in records.values()):
        return None
    return seq + 1, name, [short]


def last_common_seq(records):
    last = {rank: entries[-1][0] for rank, entries in records.items()}
    if len(set(last.values())) == 1:
        return None
    low = min(last.values())
    name = next(n for entries in records.values() for s, n in entries if s == low)
    return low, name, sorted(r for r, s in last.items() if s == low)


def ranks_that_joined(records):
    last = {rank: entries[-1][0] for rank, entries in records.items()}
    stuck = min(last.values()) + 1
    names = {s: n for entries in records.values() for s, n in entries}
    if stuck not in names:
        return None
    return stuck, names[stuck], sorted(r for r, s in last.items() if s >= stuck)


def newest_collective(records):
    last = {rank: entries[-1][0] for rank, entries in records.items()}
    if len(set(last.values())) == 1:
        return None
    top = max(last.values())
    names = {s: n for entries in records.values() for s, n in entries}
    return top, names[top], sorted(r for r, s in last.items() if s < top)


# -- 09b.physical_gpu -----------------------------------------------------------------------
def same_number(visible, local_rank, gpus):
    return local_rank if local_rank < gpus else None


def naive_index(visible, local_rank, gpus):
    if visible is None:
        return local_rank if local_rank < gpus else None
    items = [i for i in visible.split(",") if i.strip()]
    return int(items[local_rank]) if local_rank < len(items) else None


def repeats_allowed(visible, local_rank, gpus):
    ordinals = list(range(gpus)) if visible is None else []
    for item in ([] if visible is None else visible.split(",")):
        item = item.strip()
        if not item.lstrip("-").isdigit() or int(item) < 0 or int(item) >= gpus:
            break
        ordinals.append(int(item))
    return ordinals[local_rank] if local_rank < len(ordinals) else None


def no_machine_limit(visible, local_rank, gpus):
    ordinals = list(range(gpus)) if visible is None else []
    for item in ([] if visible is None else visible.split(",")):
        item = item.strip()
        ordinal = int(item) if item.lstrip("-").isdigit() else -1
        if ordinal in ordinals:
            return None
        if ordinal < 0:
            break
        ordinals.append(ordinal)
    return ordinals[local_rank] if local_rank < len(ordinals) else None


MUTANTS = [
    ("08.stop_together", plain_loop, "agree on that number"),
    ("08.stop_together", agreed_on_max, "agree on that number"),
    ("08.stop_together", joined, "Join is switched off"),
    ("08.stop_together", one_step_short, "exactly min"),
    ("09.node_sum", everyone_sum, "default group"),
    ("09.node_sum", rank_sum_closed_form, "its node's sum"),
    ("09.node_sum", strided_nodes, "its node's sum"),
    ("09.hierarchical_all_reduce", flat_all_reduce, "default group"),
    ("09.hierarchical_all_reduce", node_only, "sum over all ranks"),
    ("09.hierarchical_all_reduce", all_ranks_in_one_group, "spans nodes"),
    ("09.hierarchical_all_reduce", leaders_never_broadcast, "sum over all ranks"),
    ("08b.first_unjoined", shortest_record, "not the lengths"),
    ("08b.first_unjoined", last_common_seq, "one past the smallest last seq"),
    ("08b.first_unjoined", ranks_that_joined, "expected"),
    ("08b.first_unjoined", newest_collective, "one past the smallest last seq"),
    ("09b.physical_gpu", same_number, "k-th visible GPU"),
    ("09b.physical_gpu", naive_index, "seed"),
    ("09b.physical_gpu", repeats_allowed, "a repeated ordinal hides them all"),
    ("09b.physical_gpu", no_machine_limit, "one the machine lacks ends the list"),
]
