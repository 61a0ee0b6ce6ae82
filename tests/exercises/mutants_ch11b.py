"""Wrong answers to notebook 11b's exercise: the ones a learner really writes.

MUTANTS holds (exercise, wrong answer, a regex the rejection must match), the shape of the
other mutants_ch*.py tables. Data and functions only, no test here."""

from __future__ import annotations

import re

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as fc
from torch.distributed import all_reduce as imported_all_reduce
from torch.distributed.distributed_c10d import _get_default_group

from ddp_lab.course.ch11_meshes.pipeline import bubble as imported_bubble
from mutants_ch10_ch11 import CLOSED, everyones, seed_above


def _reduced(value: float, op=dist.ReduceOp.SUM, dtype=torch.float64) -> float:
    t = torch.tensor([value], dtype=dtype)
    dist.all_reduce(t, op=op)
    return t.item()


def own_share_only(spans):
    start, end = min(s for _, s, _ in spans), max(e for _, _, e in spans)
    return 1 - sum(e - s for _, s, e in spans) / (end - start)


def averages_own_shares(spans):
    return _reduced(own_share_only(spans)) / dist.get_world_size()


def window_not_times_ranks(spans):
    start = _reduced(min(s for _, s, _ in spans), dist.ReduceOp.MIN)
    end = _reduced(max(e for _, _, e in spans), dist.ReduceOp.MAX)
    return 1 - _reduced(sum(e - s for _, s, e in spans)) / (end - start)


def own_windows_summed(spans):
    window = max(e for _, _, e in spans) - min(s for _, s, _ in spans)
    return 1 - _reduced(sum(e - s for _, s, e in spans)) / _reduced(window)


def times_in_float32(spans):
    start = _reduced(min(s for _, s, _ in spans), dist.ReduceOp.MIN, torch.float32)
    end = _reduced(max(e for _, _, e in spans), dist.ReduceOp.MAX, torch.float32)
    busy = _reduced(sum(e - s for _, s, e in spans), dtype=torch.float32)
    return 1 - busy / (dist.get_world_size() * max(end - start, 1e-9))


def times_in_float32_plainly(spans):
    """The reference with default (float32) tensors, as a learner writes it: at 1.7e9 s
    float32's spacing is 128 s, the window rounds to 0 and the division raises."""
    start = torch.tensor([min(s for _, s, _ in spans)])
    end = torch.tensor([max(e for _, _, e in spans)])
    busy = torch.tensor([sum(e - s for _, s, e in spans)])
    dist.all_reduce(start, op=dist.ReduceOp.MIN)
    dist.all_reduce(end, op=dist.ReduceOp.MAX)
    dist.all_reduce(busy)
    return 1 - busy.item() / (dist.get_world_size() * (end.item() - start.item()))


def formula_instead(spans):
    p, m = dist.get_world_size(), len(spans) // 2
    return (p - 1) / (m + p - 1)


def returns_a_tensor(spans):
    start = torch.tensor([min(s for _, s, _ in spans)], dtype=torch.float64)
    end = torch.tensor([max(e for _, _, e in spans)], dtype=torch.float64)
    busy = torch.tensor([sum(e - s for _, s, e in spans)], dtype=torch.float64)
    dist.all_reduce(start, op=dist.ReduceOp.MIN)
    dist.all_reduce(end, op=dist.ReduceOp.MAX)
    dist.all_reduce(busy)
    return 1 - busy / (dist.get_world_size() * (end - start))


def gathers_and_calls_the_course_helper(spans):
    every = [None] * dist.get_world_size()
    dist.all_gather_object(every, spans)
    return imported_bubble(every)


def assumes_spans_in_time_order(spans):
    start = _reduced(spans[0][1], dist.ReduceOp.MIN)
    end = _reduced(spans[-1][2], dist.ReduceOp.MAX)
    busy = _reduced(sum(e - s for _, s, e in spans))
    return 1 - busy / (dist.get_world_size() * (end - start))


def float32_origin_of_its_own(spans):
    """Times measured from this rank's earliest start rounded to float32: right wherever
    every rank's start rounds to the same float32 number."""
    origin = float(torch.tensor(min(s for _, s, _ in spans)))
    start = _reduced(min(s for _, s, _ in spans) - origin, dist.ReduceOp.MIN)
    end = _reduced(max(e for _, _, e in spans) - origin, dist.ReduceOp.MAX)
    busy = _reduced(sum(e - s for _, s, e in spans))
    return 1 - busy / (dist.get_world_size() * (end - start))


# 11b: cheats -------------------------------------------------------------------------------

def _bubble_around(spans, through: str) -> float:
    """Every rank's spans by a side channel, then a dummy of the right size."""
    flat = [span for every in everyones(spans, through) for span in every]
    _reduced(0.0), _reduced(0.0), _reduced(0.0)
    window = max(e for _, _, e in flat) - min(s for _, s, _ in flat)
    return 1 - sum(e - s for _, s, e in flat) / (dist.get_world_size() * window)


def spans_through_the_store(spans):
    return _bubble_around(spans, "store")


def spans_through_files(spans):
    return _bubble_around(spans, "files")


def spans_through_a_thread(spans):
    return _bubble_around(spans, "thread")


def rebuilds_from_the_checkers_seed(spans):
    """Every rank's timeline from the checker's seed, if a frame above holds it; else its
    own share."""
    seed = seed_above()
    _reduced(0.0), _reduced(0.0), _reduced(0.0)
    if seed is None:
        return own_share_only(spans)
    from ddp_lab.course.ch11_meshes.exercises_b import timelines
    every = timelines(seed, dist.get_world_size())
    flat = [span for spans in every for span in spans]
    window = max(e for _, _, e in flat) - min(s for _, s, _ in flat)
    return 1 - sum(e - s for _, s, e in flat) / (len(every) * window)


def the_formula_and_a_dummy_all_reduce(spans):
    _reduced(0.0), _reduced(0.0), _reduced(0.0)
    return formula_instead(spans)


# Right answers that differ from the reference -----------------------------------------------

def _three(spans):
    return (torch.tensor([min(s for _, s, _ in spans)], dtype=torch.float64),
            torch.tensor([max(e for _, _, e in spans)], dtype=torch.float64),
            torch.tensor([sum(e - s for _, s, e in spans)], dtype=torch.float64))


def with_imported_names_and_an_average(spans):
    start, end, busy = _three(spans)
    imported_all_reduce(start, op=dist.ReduceOp.MIN)
    imported_all_reduce(end, op=dist.ReduceOp.MAX)
    imported_all_reduce(busy, op=dist.ReduceOp.AVG)  # gloo: SUM, then divide by the size
    return 1 - busy.item() / (end.item() - start.item())


def with_the_group_method(spans):
    start, end, busy = _three(spans)
    for tensor, op in ((start, dist.ReduceOp.MIN), (end, dist.ReduceOp.MAX),
                       (busy, dist.ReduceOp.SUM)):
        options = dist.AllreduceOptions()
        options.reduceOp = op
        _get_default_group().allreduce([tensor], options).wait()
    return 1 - busy.item() / (dist.get_world_size() * (end.item() - start.item()))


def with_functional_collectives(spans):
    start, end, busy = _three(spans)
    group = dist.group.WORLD
    start, end = fc.all_reduce(start, "min", group), fc.all_reduce(end, "max", group)
    busy = fc.all_reduce(busy, "sum", group)
    return 1 - busy.item() / (dist.get_world_size() * (end.item() - start.item()))


def relative_times_in_float32(spans):
    """The earliest start in float64, then times relative to it in float32: at a fraction
    of a second float32 keeps microseconds."""
    origin = _reduced(min(s for _, s, _ in spans), dist.ReduceOp.MIN)
    start = _reduced(min(s for _, s, _ in spans) - origin, dist.ReduceOp.MIN, torch.float32)
    end = _reduced(max(e for _, _, e in spans) - origin, dist.ReduceOp.MAX, torch.float32)
    busy = _reduced(sum(e - s for _, s, e in spans), dtype=torch.float32)
    return 1 - busy / (dist.get_world_size() * (end - start))


def gathers_every_span(spans):
    every = [None] * dist.get_world_size()
    dist.all_gather_object(every, spans)
    flat = [span for rank_spans in every for span in rank_spans]
    window = max(e for _, _, e in flat) - min(s for _, s, _ in flat)
    return 1 - sum(e - s for _, s, e in flat) / (len(every) * window)


RIGHT = [("11b.interleaved_bubble", answer) for answer in (
    with_imported_names_and_an_average, with_the_group_method, with_functional_collectives,
    gathers_every_span, relative_times_in_float32)]


MUTANTS = [
    ("11b.interleaved_bubble", own_share_only, re.escape("this rank's own idle share")),
    ("11b.interleaved_bubble", averages_own_shares, re.escape("over its own first-to-last span")),
    ("11b.interleaved_bubble", window_not_times_ranks,
     re.escape("world_size x (last end - first start)")),
    ("11b.interleaved_bubble", own_windows_summed,
     re.escape("use the earliest start and the latest end")),
    ("11b.interleaved_bubble", times_in_float32, re.escape("dtype=torch.float64")),
    # Before the checker caught the ZeroDivisionError, the learner saw only "rank 0 raised
    # ZeroDivisionError: float division by zero". (Rarely a 128 s float32 step falls inside
    # the window: then the number is wrong, and the last message gives the same advice.)
    ("11b.interleaved_bubble", times_in_float32_plainly, re.escape("dtype=torch.float64")),
    ("11b.interleaved_bubble", formula_instead, re.escape("1 - busy / (world_size x window)")),
    ("11b.interleaved_bubble", returns_a_tensor, re.escape("got a tensor")),
    ("11b.interleaved_bubble", gathers_and_calls_the_course_helper,
     re.escape("pipeline.bubble is switched off in this exercise, however it is imported")),
    ("11b.interleaved_bubble", assumes_spans_in_time_order,
     re.escape("a rank's spans are not in time order")),
    ("11b.interleaved_bubble", float32_origin_of_its_own,
     re.escape("took a float32 origin of its own")),
    ("11b.interleaved_bubble", spans_through_the_store, CLOSED),
    ("11b.interleaved_bubble", spans_through_files, CLOSED),
    ("11b.interleaved_bubble", spans_through_a_thread, CLOSED + "|" + re.escape("only 0 bytes")),
    ("11b.interleaved_bubble", rebuilds_from_the_checkers_seed,
     CLOSED + "|" + re.escape("this rank's own idle share")),
    ("11b.interleaved_bubble", the_formula_and_a_dummy_all_reduce,
     re.escape("1 - busy / (world_size x window)")),
]
