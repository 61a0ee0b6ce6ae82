"""Notebooks 03b, 05, 08b and 09b's exercises against plausible wrong answers: each must be
rejected with a message that points at the mistake (the reference solutions are accepted by
test_mutations.py's test over every registered exercise)."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

import ddp_lab.exercises as ex

pytestmark = pytest.mark.timeout(180)


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


MUTATIONS = [
    ("03b.all_reduce_list", one_all_reduce_each, "the point is ONE collective"),
    ("03b.all_reduce_list", flat_sum_not_split_back, "in its own shape"),
    ("03b.all_reduce_list", averaged_instead_of_summed, "should be the sum over the ranks"),
    ("03b.all_reduce_list", gathered_then_summed, "dist.all_gather is switched off"),
    ("05.average_gradients", summed_not_averaged, "divide by world_size"),
    ("05.average_gradients", rank0_gradients, "MEAN of the ranks' gradients"),
    ("05.average_gradients", reduced_the_parameters, "the parameters changed"),
    ("05.average_gradients", weights_only, "for every parameter that has a gradient"),
    ("08b.first_unjoined", shortest_record, "not the lengths"),
    ("08b.first_unjoined", last_common_seq, "one past the smallest last seq"),
    ("08b.first_unjoined", ranks_that_joined, "expected"),
    ("08b.first_unjoined", newest_collective, "one past the smallest last seq"),
    ("09b.physical_gpu", same_number, "k-th visible GPU"),
    ("09b.physical_gpu", naive_index, "seed"),
    ("09b.physical_gpu", repeats_allowed, "a repeated ordinal hides them all"),
    ("09b.physical_gpu", no_machine_limit, "one the machine lacks ends the list"),
]


@pytest.mark.parametrize("name, wrong, phrase", MUTATIONS,
                         ids=[f"{n}-{w.__name__}" for n, w, _ in MUTATIONS])
def test_a_wrong_answer_is_rejected_with_a_helpful_message(name, wrong, phrase):
    with pytest.raises(ex.ExerciseFailed, match=phrase) as failure:
        ex.check(name, wrong)
    assert "seed" in str(failure.value)


@pytest.mark.parametrize("name", sorted({name for name, _, _ in MUTATIONS}))
def test_each_has_three_wrong_answers_and_a_notebook_of_its_prefix(name):
    assert sum(n == name for n, _, _ in MUTATIONS) >= 3
    assert ex.describe(name)
