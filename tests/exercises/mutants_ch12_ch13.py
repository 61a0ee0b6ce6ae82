"""Wrong answers to the exercises of notebooks 12 and 13: the ones a learner really writes.

MUTANTS holds (exercise, wrong answer, a regex the rejection must match); test_mutations.py
checks every one with a single parametrized test. Data and functions only, no test here."""

from __future__ import annotations

import torch


# 12.online_softmax: wrong answers -----------------------------------------------------------

def forgets_to_rescale_acc(acc, m, l, scores, v):
    m_new = torch.maximum(m, scores.amax(-1))
    p = torch.exp(scores - m_new[..., None])
    return acc + p @ v, m_new, l * torch.exp(m - m_new) + p.sum(-1)


def forgets_to_rescale_l(acc, m, l, scores, v):
    m_new = torch.maximum(m, scores.amax(-1))
    p = torch.exp(scores - m_new[..., None])
    return acc * torch.exp(m - m_new)[..., None] + p @ v, m_new, l + p.sum(-1)


def no_running_max(acc, m, l, scores, v):
    p = torch.exp(scores)
    return acc + p @ v, torch.zeros_like(m), l + p.sum(-1)


def normalizes_each_block(acc, m, l, scores, v):
    m_new = torch.maximum(m, scores.amax(-1))
    p = torch.exp(scores - m_new[..., None])
    correction = torch.exp(m - m_new)
    block = (p @ v) / p.sum(-1, keepdim=True)
    return acc * correction[..., None] + block, m_new, l * correction + p.sum(-1)


def block_max_only(acc, m, l, scores, v):
    m_new = scores.amax(-1)
    p = torch.exp(scores - m_new[..., None])
    return acc + p @ v, m_new, l + p.sum(-1)


MUTANTS = [
    ("12.online_softmax", forgets_to_rescale_acc, r"rescale the old acc by exp\(m_old - m_new\)"),
    ("12.online_softmax", forgets_to_rescale_l, r"old sum l\s+must be rescaled"),
    ("12.online_softmax", no_running_max, r"overflows\. Subtract the running maximum"),
    ("12.online_softmax", normalizes_each_block, r"do not normalize inside a step"),
    ("12.online_softmax", block_max_only, r"m must be the running maximum"),
]


# 13.dispatch: wrong answers -----------------------------------------------------------------

def _exchanged(rows, counts):
    import torch.distributed as dist
    got = torch.empty_like(counts)
    dist.all_to_all_single(got, counts)
    arrived = rows.new_empty((int(got.sum()), rows.shape[1]))
    dist.all_to_all_single(arrived, rows, got.sum(1).tolist(), counts.sum(1).tolist())
    return arrived, got


def keeps_its_own_rows(rows, counts):
    return rows, counts


def returns_the_counts_it_sent(rows, counts):
    arrived, _ = _exchanged(rows, counts)
    return arrived, counts


def sorts_by_expert(rows, counts):
    arrived, got = _exchanged(rows, counts)
    world, local = got.shape
    expert = torch.repeat_interleave(torch.arange(local).repeat(world), got.reshape(-1))
    return arrived[torch.argsort(expert, stable=True)], got


MUTANTS += [
    ("13.dispatch", keeps_its_own_rows, r"this rank's own rows"),
    ("13.dispatch", returns_the_counts_it_sent, r"got is what this rank sent"),
    ("13.dispatch", sorts_by_expert, r"right rows in the wrong order"),
]
