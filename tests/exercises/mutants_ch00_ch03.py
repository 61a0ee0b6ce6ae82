"""Wrong answers to the exercises of notebooks 00 to 03, 00b and 03b:
the ones a learner really writes.

MUTANTS holds (exercise, wrong answer, a regex the rejection must match); test_mutations.py
checks every one with a single parametrized test. Data and functions only, no test here."""

from __future__ import annotations

import time

import torch
import torch.distributed as dist

from ddp_lab.course.ch02_point_to_point import exercises as ch02


# -- 00 --------------------------------------------------------------------------------------
def closed_form(value):
    return float((dist.get_world_size() - 1) ** 2)


def own_value(value):
    return value


def summed(value):
    t = torch.tensor([float(value)], dtype=torch.float64)
    dist.all_reduce(t)
    return t.item()


# -- 00b -------------------------------------------------------------------------------------
def agrees_with_itself(model):
    v = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    return torch.equal(v, v)


def compares_with_rank0(model):
    v = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    first = v.clone()
    dist.broadcast(first, src=0)
    return torch.equal(v, first)


def summed_within_tolerance(model):
    v = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    total = v.clone()
    dist.all_reduce(total)
    return torch.allclose(total, v * dist.get_world_size())


def averaged_in_place(model):
    for p in model.parameters():
        dist.all_reduce(p.data)
        p.data /= dist.get_world_size()
    return True


def max_only(model):
    v = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    top = v.clone()
    dist.all_reduce(top, op=dist.ReduceOp.MAX)
    return torch.equal(top, v)


# -- 01 --------------------------------------------------------------------------------------
def sleeping_barrier(store, world_size, name):
    time.sleep(1)


def leaky_barrier(store, world_size, name):
    store.add(f"{name}/count", 1)


def same_keys_every_time(store, world_size, name):
    if store.add("count", 1) == world_size:
        store.set("go", "1")
    store.wait(["go"])


def opened_one_too_early(store, world_size, name):
    if store.add(f"{name}/count", 1) >= world_size - 1:
        store.set(f"{name}/go", "1")
    store.wait([f"{name}/go"])


def plain_print(line):
    print(line)


def sleep_then_print(line):
    time.sleep(0.2 * dist.get_rank())
    print(line)


def reversed_turns(line):
    for turn in reversed(range(dist.get_world_size())):
        if turn == dist.get_rank():
            print(line, flush=True)
        dist.barrier()


# -- 02 --------------------------------------------------------------------------------------
def builtin_all_gather(tensor):
    out = [torch.empty_like(tensor) for _ in range(dist.get_world_size())]
    dist.all_gather(out, tensor)
    return out


def my_own_everywhere(tensor):
    return [tensor.clone() for _ in range(dist.get_world_size())]


def ring_off_by_one(tensor):
    rank, world = dist.get_rank(), dist.get_world_size()
    gathered = [torch.empty_like(tensor) for _ in range(world)]
    gathered[rank] = tensor.clone()
    for step in range(world - 1):
        outgoing = gathered[(rank - step) % world]
        incoming = gathered[(rank + step + 1) % world]  # should be (rank - step - 1)
        for request in (dist.isend(outgoing, (rank + 1) % world),
                        dist.irecv(incoming, (rank - 1) % world)):
            request.wait()
    return gathered


def shift_the_wrong_way(tensor, k):
    return ch02.shift(tensor, -k)


def shift_nothing(tensor, k):
    return tensor.clone()


def shift_by_broadcast(tensor, k):
    return builtin_all_gather(tensor)[(dist.get_rank() - k) % dist.get_world_size()]


# -- 03 --------------------------------------------------------------------------------------
def chunks_unchanged(chunks):
    return list(chunks)


def builtin_all_to_all(chunks):
    out = [torch.empty_like(c) for c in chunks]
    dist.all_to_all(out, list(chunks))
    return out


def scatters_in_reverse(chunks):
    from ddp_lab.course.ch03_collectives.exercises import all_to_all_by_scatter
    return all_to_all_by_scatter(chunks)[::-1]


# -- 03b.all_reduce_list --------------------------------------------------------------------
def one_all_reduce_each(tensors):
    for t in tensors:
        dist.all_reduce(t)
    return tensors


def flat_sum_not_split_back(tensors):
    flat = torch.cat([t.reshape(-1) for t in tensors])
    dist.all_reduce(flat)
    return list(flat.split([t.numel() for t in tensors]))


def averaged_instead_of_summed(tensors):
    flat = torch.cat([t.reshape(-1) for t in tensors])
    dist.all_reduce(flat)
    flat /= dist.get_world_size()
    return [p.view_as(t) for p, t in zip(flat.split([t.numel() for t in tensors]), tensors)]


def gathered_then_summed(tensors):
    flat = torch.cat([t.reshape(-1) for t in tensors])
    out = [torch.empty_like(flat) for _ in range(dist.get_world_size())]
    dist.all_gather(out, flat)
    total = torch.stack(out).sum(dim=0)
    return [p.view_as(t) for p, t in zip(total.split([t.numel() for t in tensors]), tensors)]


MUTANTS = [
    ("00.max_over_ranks", closed_form, "expected the largest"),
    ("00.max_over_ranks", own_value, "expected the largest"),
    ("00.max_over_ranks", summed, "ReduceOp.MAX"),
    ("00b.weights_agree", agrees_with_itself, "yet every rank answered True"),
    ("00b.weights_agree", compares_with_rank0, "must give the same answer"),
    ("00b.weights_agree", summed_within_tolerance, "compare exactly"),
    ("00b.weights_agree", averaged_in_place, "weights changed during your function"),
    ("00b.weights_agree", max_only, "must give the same answer"),
    ("01.store_barrier", sleeping_barrier, "time.sleep is switched off"),
    ("01.store_barrier", leaky_barrier, "held back on purpose"),
    ("01.store_barrier", same_keys_every_time, "keys of its own"),
    ("01.store_barrier", opened_one_too_early, "left before rank"),
    ("01.rank_ordered_print", plain_print, "came out as"),
    ("01.rank_ordered_print", sleep_then_print, "time.sleep is switched off"),
    ("01.rank_ordered_print", reversed_turns, "only after every lower rank"),
    ("02.all_gather", builtin_all_gather, "dist.all_gather is switched off"),
    ("02.all_gather", my_own_everywhere, r"item \[1\] should be rank 1's tensor"),
    ("02.all_gather", ring_off_by_one, "should be rank"),
    ("02.shift", shift_the_wrong_way, "k places|rank - k"),
    ("02.shift", shift_nothing, "rank - k"),
    ("02.shift", shift_by_broadcast, "switched off"),
    ("03.all_to_all", chunks_unchanged, "what rank 1 sent to rank 0"),
    ("03.all_to_all", builtin_all_to_all, "dist.all_to_all is switched off"),
    ("03.all_to_all", scatters_in_reverse, "should be chunk"),
    ("03b.all_reduce_list", one_all_reduce_each, "the point is ONE collective"),
    ("03b.all_reduce_list", flat_sum_not_split_back, "in its own shape"),
    ("03b.all_reduce_list", averaged_instead_of_summed, "should be the sum over the ranks"),
    ("03b.all_reduce_list", gathered_then_summed, "dist.all_gather is switched off"),
]
