"""Wrong answers to the exercises of notebooks 12 and 13: the ones a learner really writes.

MUTANTS holds (exercise, wrong answer, a regex the rejection must match); test_mutations.py
checks every one with a single parametrized test. Data and functions only, no test here."""

from __future__ import annotations

import re
import sys

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as fc
from torch import exp, maximum
from torch.distributed import all_to_all_single as imported_all_to_all_single
from torch.distributed.distributed_c10d import _get_default_group

from ddp_lab.scratch.moe import dispatch as imported_dispatch
from mutants_ch10_ch11 import CLOSED, everyones, seed_above
from ddp_lab.scratch.ring_attention import online_softmax_step as imported_step


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


def calls_the_scratch_step(acc, m, l, scores, v):
    return imported_step(acc, m, l, scores, v)


def one_maximum_for_the_block(acc, m, l, scores, v):
    m_new = torch.maximum(m, scores.max())  # one number for every row, not each row's own
    p = torch.exp(scores - m_new[..., None])
    correction = torch.exp(m - m_new)
    return acc * correction[..., None] + p @ v, m_new, l * correction + p.sum(-1)


def returns_the_output_only(acc, m, l, scores, v):
    m_new = torch.maximum(m, scores.amax(-1))
    p = torch.exp(scores - m_new[..., None])
    correction = torch.exp(m - m_new)
    return acc * correction[..., None] + p @ v, l * correction + p.sum(-1)


# 12.online_softmax: right answers that differ from the reference ----------------------------

def with_imported_torch_names(acc, m, l, scores, v):
    m_new = maximum(m, scores.amax(-1))
    p = exp(scores - m_new[..., None])
    correction = exp(m - m_new)
    return acc * correction[..., None] + p @ v, m_new, l * correction + p.sum(-1)


def with_an_explicit_first_block(acc, m, l, scores, v):
    m_new = torch.maximum(m, scores.amax(-1))
    p = torch.exp(scores - m_new[..., None])
    correction = torch.where(torch.isinf(m), torch.zeros_like(m), torch.exp(m - m_new))
    return torch.addcmul(p @ v, acc, correction[..., None]), m_new, torch.addcmul(
        p.sum(-1), l, correction)


def works_on_the_scores_in_place(acc, m, l, scores, v):
    """Right: exp of the shifted scores in the scores' own memory (the check once read the
    expected maximum after the step, from scores the step had overwritten)."""
    m_new = torch.maximum(m, scores.amax(-1))
    p = scores.sub_(m_new[..., None]).exp_()
    correction = torch.exp(m - m_new)
    return acc * correction[..., None] + p @ v, m_new, l * correction + p.sum(-1)


def reads_m_from_the_callers_frame(acc, m, l, scores, v):
    """The expected maximum from the checker's frame, if it holds one (the frame is closed,
    and holds only copies of the step's inputs); with nothing found, the block's maximum."""
    found = sys._getframe(1).f_locals.get("want_m")
    m_new = found if isinstance(found, torch.Tensor) else scores.amax(-1)
    p = torch.exp(scores - m_new[..., None])
    correction = torch.exp(m - m_new)
    return acc * correction[..., None] + p @ v, m_new, l * correction + p.sum(-1)


RIGHT = [("12.online_softmax", with_imported_torch_names),
         ("12.online_softmax", with_an_explicit_first_block),
         ("12.online_softmax", works_on_the_scores_in_place)]


MUTANTS = [
    ("12.online_softmax", calls_the_scratch_step, re.escape("online_softmax_step is switched "
                                                            "off in this exercise, however")),
    # the step's m is checked against the exact running maximum, so each wrong m is named
    # on every seed (before it underflows a row's sum, overflows, or skews a normalizer)
    ("12.online_softmax", one_maximum_for_the_block, "not one number for the whole block"),
    ("12.online_softmax", returns_the_output_only, re.escape("must return (acc, m, l)")),
    ("12.online_softmax", forgets_to_rescale_acc, r"rescale the old acc by exp\(m_old - m_new\)"),
    ("12.online_softmax", forgets_to_rescale_l, r"old sum l\s+must be rescaled"),
    ("12.online_softmax", no_running_max, r"not 0: without it exp\(\) of a score .* overflows"),
    ("12.online_softmax", normalizes_each_block, r"do not normalize inside a step"),
    ("12.online_softmax", block_max_only, r"not this block's maximum alone"),
    ("12.online_softmax", reads_m_from_the_callers_frame,
     CLOSED + "|" + r"not this block's maximum alone"),
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


def pads_every_block_to_the_largest(rows, counts):
    world, width = counts.shape[0], rows.shape[1]
    got = torch.empty_like(counts)
    dist.all_to_all_single(got, counts)
    block = torch.tensor([int(counts.sum(1).max())])
    dist.all_reduce(block, op=dist.ReduceOp.MAX)
    size, sent = int(block), counts.sum(1).tolist()
    padded = rows.new_zeros((world * size, width))
    for j, piece in enumerate(rows.split(sent)):
        padded[j * size:j * size + len(piece)] = piece
    inbox = torch.empty_like(padded)
    dist.all_to_all_single(inbox, padded)
    kept = [inbox[j * size:j * size + int(got[j].sum())] for j in range(world)]
    return torch.cat(kept), got


def sends_every_row_everywhere(rows, counts):
    mine = (rows, counts)
    every = [None] * dist.get_world_size()
    dist.all_gather_object(every, mine)
    rank = dist.get_rank()
    arrived = [r[int(c[:rank].sum()):int(c[:rank + 1].sum())] for r, c in every]
    return torch.cat(arrived), torch.stack([c[rank] for _, c in every])


def dispatches_with_the_scratch_code(rows, counts):
    return imported_dispatch(rows, counts)


def moves_the_rows_in_half_precision(rows, counts):
    got = torch.empty_like(counts)
    dist.all_to_all_single(got, counts)
    half = rows.half().new_empty((int(got.sum()), rows.shape[1]))
    dist.all_to_all_single(half, rows.half(), got.sum(1).tolist(), counts.sum(1).tolist())
    return half.float(), got


def forgets_the_split_sizes(rows, counts):
    got = torch.empty_like(counts)
    dist.all_to_all_single(got, counts)
    arrived = rows.new_empty((int(got.sum()), rows.shape[1]))
    dist.all_to_all_single(arrived, rows)
    return arrived, got


def swaps_the_split_sizes(rows, counts):
    got = torch.empty_like(counts)
    dist.all_to_all_single(got, counts)
    arrived = rows.new_empty((int(got.sum()), rows.shape[1]))
    dist.all_to_all_single(arrived, rows, counts.sum(1).tolist(), got.sum(1).tolist())
    return arrived, got


def reads_the_width_from_the_first_row(rows, counts):
    """Right on every rank that sends something; a rank that sends nothing has no first row."""
    got = torch.empty_like(counts)
    dist.all_to_all_single(got, counts)
    arrived = rows.new_empty((int(got.sum()), len(rows[0])))
    dist.all_to_all_single(arrived, rows, got.sum(1).tolist(), counts.sum(1).tolist())
    return arrived, got


def sends_lists_of_blocks(rows, counts):
    """dist.all_to_all with lists of blocks of their own sizes: right on NCCL; gloo's list
    form needs every block the same size."""
    width = rows.shape[1]
    got = torch.empty_like(counts)
    dist.all_to_all_single(got, counts)
    inbox = [rows.new_empty((int(n), width)) for n in got.sum(1)]
    dist.all_to_all(inbox, list(rows.split(counts.sum(1).tolist())))
    return torch.cat(inbox), got


def counts_got_by_expert_not_by_rank(rows, counts):
    """The rows right; got summed into one row per expert (what the experts need in all),
    not kept per source rank."""
    arrived, got = _exchanged(rows, counts)
    return arrived, got.sum(0, keepdim=True).expand_as(got).contiguous()


# 13.dispatch: right answers that differ from the reference ----------------------------------

def with_imported_names(rows, counts):
    got = torch.empty_like(counts)
    imported_all_to_all_single(got, counts)
    arrived = rows.new_empty((int(got.sum()), rows.shape[1]))
    imported_all_to_all_single(arrived, rows, got.sum(1).tolist(), counts.sum(1).tolist())
    return arrived, got


def gathers_the_counts(rows, counts):
    """Every rank's counts by all-gather (gloo's list all_to_all wants equal sizes, so the
    rows still go by all_to_all_single)."""
    world, rank = counts.shape[0], dist.get_rank()
    every = torch.empty((world * world, counts.shape[1]), dtype=counts.dtype)
    dist.all_gather_into_tensor(every, counts)  # gloo wants the ranks' tensors end to end
    got = every.view(world, world, -1)[:, rank].contiguous()
    arrived = rows.new_empty((int(got.sum()), rows.shape[1]))
    dist.all_to_all_single(arrived, rows, got.sum(1).tolist(), counts.sum(1).tolist())
    return arrived, got


def with_the_group_method(rows, counts):
    group = _get_default_group()
    got = torch.empty_like(counts)
    group.alltoall_base(got, counts, [], [], dist.AllToAllOptions()).wait()
    arrived = rows.new_empty((int(got.sum()), rows.shape[1]))
    group.alltoall_base(arrived, rows, got.sum(1).tolist(), counts.sum(1).tolist(),
                        dist.AllToAllOptions()).wait()
    return arrived, got


def with_functional_collectives(rows, counts):
    group = dist.group.WORLD
    got = fc.all_to_all_single(counts, None, None, group).wait()
    arrived = fc.all_to_all_single(rows, got.sum(1).tolist(), counts.sum(1).tolist(), group)
    return arrived.wait(), got


def exchanges_the_counts_as_objects(rows, counts):
    world, rank = counts.shape[0], dist.get_rank()
    every = [None] * world
    dist.all_gather_object(every, counts)
    got = torch.stack([c[rank] for c in every])
    arrived = rows.new_empty((int(got.sum()), rows.shape[1]))
    dist.all_to_all_single(arrived, rows, got.sum(1).tolist(), counts.sum(1).tolist())
    return arrived, got


def sends_point_to_point(rows, counts):
    """The counts by all-to-all, the rows by one batch of isend/irecv per peer: each row is
    sent once and received once (the check counted both, and refused it, once)."""
    world, rank = counts.shape[0], dist.get_rank()
    got = torch.empty_like(counts)
    dist.all_to_all_single(got, counts)
    sent = rows.split(counts.sum(1).tolist())
    inbox = [rows.new_empty((int(n), rows.shape[1])) for n in got.sum(1)]
    inbox[rank].copy_(sent[rank])
    ops = [op for j in range(world) if j != rank for op in (
        [dist.P2POp(dist.isend, sent[j].contiguous(), j)] * bool(len(sent[j]))
        + [dist.P2POp(dist.irecv, inbox[j], j)] * bool(len(inbox[j])))]
    for work in dist.batch_isend_irecv(ops) if ops else ():
        work.wait()
    return torch.cat(inbox), got


def counts_exchanged_as_floats(rows, counts):
    """Right values, but counts turned float on the way (a default-dtype buffer) and back:
    right here, and exact up to 2**24 rows."""
    got = torch.zeros(counts.shape)
    dist.all_to_all_single(got, counts.float())
    got = got.long()
    arrived = rows.new_empty((int(got.sum()), rows.shape[1]))
    dist.all_to_all_single(arrived, rows, got.sum(1).tolist(), counts.sum(1).tolist())
    return arrived, got


RIGHT += [("13.dispatch", answer) for answer in (
    with_imported_names, gathers_the_counts, with_the_group_method,
    with_functional_collectives, exchanges_the_counts_as_objects, sends_point_to_point,
    counts_exchanged_as_floats)]


# 13.dispatch: buffers in the default dtype, and cheats --------------------------------------

def receives_into_default_float_buffers(rows, counts):
    """torch.empty(n, width) for the rows: float32, whatever the rows are."""
    got = torch.empty_like(counts)
    dist.all_to_all_single(got, counts)
    arrived = torch.empty(int(got.sum()), rows.shape[1])
    dist.all_to_all_single(arrived, rows, got.sum(1).tolist(), counts.sum(1).tolist())
    return arrived, got


def returns_float_counts(rows, counts):
    got = torch.zeros(counts.shape)
    dist.all_to_all_single(got, counts.float())
    arrived = rows.new_empty((int(got.sum()), rows.shape[1]))
    dist.all_to_all_single(arrived, rows, got.sum(1).long().tolist(), counts.sum(1).tolist())
    return arrived, got


def _dispatched_from(every: list, rank: int):
    """What ``rank`` receives, worked out from every rank's (rows, counts)."""
    blocks = [r[int(c[:rank].sum()):int(c[:rank + 1].sum())] for r, c in every]
    return torch.cat(blocks), torch.stack([c[rank] for _, c in every])


def _around(rows, counts, through: str):
    """Every rank's rows by a side channel, then the right-sized all-to-alls, of zeros."""
    answer = _dispatched_from(everyones((rows, counts), through), dist.get_rank())
    _exchanged(torch.zeros_like(rows), counts)
    return answer


def rows_through_the_store(rows, counts):
    return _around(rows, counts, "store")


def rows_through_files(rows, counts):
    return _around(rows, counts, "files")


def rows_through_a_thread(rows, counts):
    return _around(rows, counts, "thread")


def rebuilds_from_the_checkers_seed(rows, counts):
    """The expected rows from the checker's seed, if a frame above holds it, and a dummy
    dispatch of zeros of the right size; with nothing found, its own rows."""
    seed = seed_above()
    _exchanged(torch.zeros_like(rows), counts)
    if seed is None:
        return rows, counts
    from ddp_lab.course.ch13_experts.exercises import _expected
    want = _expected(seed, dist.get_world_size(), dist.get_rank())
    return want["arrived"], want["got"]


def moves_zeros_and_keeps_its_rows(rows, counts):
    """A dispatch of the right size that carries zeros, and the rows never leave."""
    arrived, got = _exchanged(torch.zeros_like(rows), counts)
    return arrived, got


MUTANTS += [
    ("13.dispatch", keeps_its_own_rows, r"this rank's own rows"),
    ("13.dispatch", returns_the_counts_it_sent, r"got is what this rank sent"),
    ("13.dispatch", sorts_by_expert, r"right rows in the wrong order"),
    ("13.dispatch", pads_every_block_to_the_largest, re.escape("no padding to the largest")),
    ("13.dispatch", sends_every_row_everywhere, re.escape("each row travels once")),
    ("13.dispatch", dispatches_with_the_scratch_code,
     re.escape("scratch.moe.dispatch is switched off in this exercise, however it is imported")),
    ("13.dispatch", moves_the_rows_in_half_precision, re.escape("travelled as torch.float16")),
    ("13.dispatch", forgets_the_split_sizes, re.escape("pass output_split_sizes and input")),
    ("13.dispatch", swaps_the_split_sizes, re.escape("the split sizes do not add up")),
    ("13.dispatch", reads_the_width_from_the_first_row, r"index 0 is out of bounds"),
    ("13.dispatch", sends_lists_of_blocks,
     re.escape("gloo's list form, dist.all_to_all(output_list, input_list), needs every block")),
    ("13.dispatch", counts_got_by_expert_not_by_rank,
     re.escape("got must say how many rows came from rank j for expert e: int64 of shape")),
    ("13.dispatch", receives_into_default_float_buffers,
     re.escape("a receive buffer must have the dtype of what it receives")),
    ("13.dispatch", returns_float_counts, re.escape("it must be torch.int64 like counts")),
    ("13.dispatch", rows_through_the_store, CLOSED),
    ("13.dispatch", rows_through_files, CLOSED),
    ("13.dispatch", rows_through_a_thread, CLOSED),
    ("13.dispatch", rebuilds_from_the_checkers_seed, CLOSED + "|this rank's own rows"),
    ("13.dispatch", moves_zeros_and_keeps_its_rows, re.escape("the rows received differ")),
]
