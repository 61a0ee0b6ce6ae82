"""Notebook 03b's exercise: all-reduce a list of tensors with ONE collective.

The notebook's cat/chunk trick gathers a list with one ``all_gather``; here the learner
applies it to a sum, which is what DDP's gradient buckets do. While the learner's function
runs, every collective except ``all_reduce`` is switched off and ``all_reduce`` is counted
(on ``torch.distributed`` and ``distributed_c10d`` alike), so a loop over the tensors is seen.
Shapes, count and values are random per check; the answer is compared with torch's own
``all_reduce`` of each tensor, run after the learner's function.
"""

from __future__ import annotations

import contextlib
import importlib

import torch
import torch.distributed as dist

from ddp_lab.exercises.builtins_off import COLLECTIVES, replaced, switched_off
from ddp_lab.exercises.driver import (WORLD_SIZES, generator, new_seed, run_ranks,
                                     tensor_problem)
from ddp_lab.exercises.driver import where as on
from ddp_lab.exercises.registry import Exercise, ExerciseFailed

NOT_ALL_REDUCE = tuple(name for name in COLLECTIVES if name != "all_reduce") + (
    "send", "recv", "isend", "irecv", "batch_isend_irecv")


def all_reduce_list(tensors: list[torch.Tensor]) -> list[torch.Tensor]:
    """Reference: flatten and concatenate, one all_reduce, split back into the shapes.
    One collective pays the fixed cost of a round of messages once instead of per tensor."""
    flat = torch.cat([t.reshape(-1) for t in tensors])
    dist.all_reduce(flat)
    return [part.view_as(t) for part, t in zip(flat.split([t.numel() for t in tensors]),
                                               tensors)]


@contextlib.contextmanager
def counted_all_reduce(calls: list):
    """``dist.all_reduce`` that appends to ``calls`` each time it runs, then does its job."""
    c10d = importlib.import_module("torch.distributed.distributed_c10d")
    original = c10d.all_reduce

    def all_reduce(*args, **kwargs):
        calls.append("all_reduce")
        return original(*args, **kwargs)

    with replaced(dist, "all_reduce", all_reduce), replaced(c10d, "all_reduce", all_reduce):
        yield


def random_list(seed: int, rank: int) -> list[torch.Tensor]:
    """2-5 float tensors of random shapes (the same on every rank; the first one 2-D, so a
    result left flat shows), values per rank."""
    same = generator(seed)
    count = int(torch.randint(2, 6, (1,), generator=same))
    dims = [2] + [int(d) for d in torch.randint(1, 3, (count - 1,), generator=same)]
    shapes = [tuple(int(s) for s in torch.randint(1, 5, (d,), generator=same)) for d in dims]
    return [torch.randn(shape, generator=generator(seed, rank, i)) for i, shape in
            enumerate(shapes)]


def _trial(fn, seed: int):
    tensors = random_list(seed, dist.get_rank())
    calls: list = []
    with switched_off(NOT_ALL_REDUCE, "use one dist.all_reduce"), counted_all_reduce(calls):
        got = fn([t.clone() for t in tensors])
    expected = [t.clone() for t in tensors]
    for t in expected:
        dist.all_reduce(t)
    return got, expected, len(calls)


def check_all_reduce_list(fn) -> str:
    seed = new_seed()
    for n in WORLD_SIZES:
        values = run_ranks(_trial, n, (fn, seed), where=on(n, seed),
                           hang_hint="Every rank must make the same all_reduce calls.")
        for rank, (got, expected, calls) in enumerate(values):
            _judge(got, expected, calls, f"{on(n, seed)}, rank {rank}")
    return f"the same sums as one all_reduce per tensor, with one collective, on 1-4 ranks " \
           f"(seed {seed})"


def _judge(got, expected: list, calls: int, where: str) -> None:
    if calls != 1:
        raise ExerciseFailed(
            f"{where} made {calls} all_reduce calls for {len(expected)} tensors: the point "
            "is ONE collective. torch.cat the flattened tensors, all_reduce that, split back.")
    if not isinstance(got, (list, tuple)) or len(got) != len(expected):
        raise ExerciseFailed(f"{where} returned {got!r}: expected a list of {len(expected)} "
                             "tensors, the sums of the input tensors in their order")
    for i, (mine, want) in enumerate(zip(got, expected)):
        problem = tensor_problem(mine, want, exact=False)
        if problem:
            raise ExerciseFailed(f"{where}, tensor [{i}] should be the sum over the ranks of "
                                 f"their tensor [{i}], in its own shape: {problem}")


EXERCISES = (
    Exercise(
        name="03b.all_reduce_list",
        notebook="03b_collectives_in_practice",
        summary="my_all_reduce_list(tensors): every tensor summed over the ranks, with one "
                "all_reduce",
        hint="flat = torch.cat([t.reshape(-1) for t in tensors]); dist.all_reduce(flat); "
             "split flat by the numels and view each part as its tensor.",
        solution=all_reduce_list,
        checker=check_all_reduce_list,
        answered_by=("ddp_lab.course.ch03_collectives.costs:cat_all_gather",),
    ),
)
