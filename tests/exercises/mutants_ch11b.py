"""Wrong answers to notebook 11b's exercise: the ones a learner really writes.

MUTANTS holds (exercise, wrong answer, a regex the rejection must match), the shape of the
other mutants_ch*.py tables. Data and functions only, no test here."""

from __future__ import annotations

import re

import torch
import torch.distributed as dist


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


def formula_instead(spans):
    p, m = dist.get_world_size(), len(spans) // 2
    return (p - 1) / (m + p - 1)


MUTANTS = [
    ("11b.interleaved_bubble", own_share_only, re.escape("this rank's own idle share")),
    ("11b.interleaved_bubble", averages_own_shares, re.escape("over its own first-to-last span")),
    ("11b.interleaved_bubble", window_not_times_ranks, re.escape("world_size x (last end - first start)")),
    ("11b.interleaved_bubble", own_windows_summed, re.escape("use the earliest start and the latest end")),
    ("11b.interleaved_bubble", times_in_float32, re.escape("dtype=torch.float64")),
    ("11b.interleaved_bubble", formula_instead, re.escape("1 - busy / (world_size x window)")),
]
