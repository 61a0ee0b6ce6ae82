"""Notebook 03b's exercise: all-reduce a list of tensors with ONE collective.

The notebook's cat/chunk trick gathers a list with one ``all_gather``; here the learner
applies it to a sum, which is what DDP's gradient buckets do. The cost is the point, and it
is measured where every collective passes, the dispatcher (:class:`CollectiveTrace`: an
imported ``all_reduce``, ``distributed_c10d.all_reduce``, the process group's ``allreduce``
and the functional ``all_reduce`` all count): while the learner's function runs every other
collective is switched off, and there must be exactly one all-reduce, carrying exactly the
list's bytes in the list's dtype (not a loop, not a float64 copy, not a float16 one). Shapes,
count and values are random per check, float32 on some world sizes and float64 on the
others, made by the checker, which hands each rank only its own list
(:func:`~ddp_lab.exercises.sealed.deal`) and compares each answer with the sums it computes
itself, tensor by tensor; the store, files and threads are closed while the function runs.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from ddp_lab.course.collective_trace import FAMILIES, CollectiveTrace
from ddp_lab.exercises.driver import WORLD_SIZES, each_world, generator, new_seed, tensor_problem
from ddp_lab.exercises.driver import where as on
from ddp_lab.exercises.registry import Exercise, ExerciseFailed
from ddp_lab.exercises.sealed import deal

ONE_ALL_REDUCE = "use one dist.all_reduce"


def all_reduce_list(tensors: list[torch.Tensor]) -> list[torch.Tensor]:
    """Reference: flatten and concatenate, one all_reduce, split back into the shapes.
    One collective pays the fixed cost of a round of messages once instead of per tensor."""
    flat = torch.cat([t.reshape(-1) for t in tensors])
    dist.all_reduce(flat)
    return [part.view_as(t) for part, t in zip(flat.split([t.numel() for t in tensors]),
                                               tensors)]


def random_list(seed: int, rank: int, world_size: int = 1) -> list[torch.Tensor]:
    """2-5 tensors of random shapes (the same on every rank; the first one 2-D, so a result
    left flat shows), float32 or float64 by the world size, values per rank."""
    same = generator(seed)
    count = int(torch.randint(2, 6, (1,), generator=same))
    dims = [2] + [int(d) for d in torch.randint(1, 3, (count - 1,), generator=same)]
    shapes = [tuple(int(s) for s in torch.randint(1, 5, (d,), generator=same)) for d in dims]
    dtype = (torch.float32, torch.float64)[(seed + world_size) % 2]
    return [torch.randn(shape, generator=generator(seed, rank, i)).to(dtype) for i, shape in
            enumerate(shapes)]


def _trial(fn, dealt):
    """The learner's result for this rank's list, and the collectives it made."""
    tensors = dealt.take()
    with CollectiveTrace(forbid=set(FAMILIES) - {"all_reduce"}, why=ONE_ALL_REDUCE) as trace:
        got = fn(tensors)
    return got, [(call.name, call.nbytes, call.dtype) for call in trace.calls]


def summed(lists: list[list[torch.Tensor]]) -> list[torch.Tensor]:
    """Tensor i of the answer: the sum over the ranks of their tensor i, in its dtype."""
    return [torch.stack(column).sum(0) for column in zip(*lists)]


def check_all_reduce_list(fn) -> str:
    seed = new_seed()
    lists = {n: [random_list(seed, rank, n) for rank in range(n)] for n in WORLD_SIZES}
    sums = {n: summed(lists[n]) for n in WORLD_SIZES}
    each_world(_trial, lambda n: (fn, deal(lists[n])),
               lambda value, rank, n: _judge(*value, sums[n], lists[n][rank],
                                             f"{on(n, seed)}, rank {rank}"), seed,
               hang_hint="Every rank must make the same all_reduce calls.")
    return (f"the same sums as one all_reduce per tensor, with one all_reduce of exactly the "
            f"list's bytes, on 1-4 ranks, float32 and float64 (seed {seed})")


def _judge(got, calls: list, expected: list, mine: list, where: str) -> None:
    problem = _cost_problem(calls, expected)
    if problem:
        raise ExerciseFailed(f"{where} {problem}")
    if not isinstance(got, (list, tuple)) or len(got) != len(expected):
        raise ExerciseFailed(f"{where} returned {got!r}: expected a list of {len(expected)} "
                             "tensors, the sums of the input tensors in their order")
    for i, (tensor, want) in enumerate(zip(got, expected)):
        problem = tensor_problem(tensor, want, exact=False, mine=mine[i])
        if problem:
            raise ExerciseFailed(f"{where}, tensor [{i}] should be the sum over the ranks of "
                                 f"their tensor [{i}], in its own shape: {problem}")


def _cost_problem(calls: list, expected: list) -> str | None:
    total = sum(t.numel() * t.element_size() for t in expected)
    dtype = expected[0].dtype
    if len(calls) != 1:
        return (f"made {len(calls)} all_reduce calls for {len(expected)} tensors: the point "
                "is ONE collective, whatever the length of the list (each call pays a round "
                "of messages).")
    name, nbytes, carried = calls[0]
    if "coalesced" in name:  # one call for the whole list: the record holds its largest tensor
        nbytes = total if carried == dtype else nbytes
    if carried != dtype or nbytes != total:
        return (f"made one all_reduce ({name}) of {nbytes} bytes of {carried}, and the "
                f"tensors hold {total} bytes of {dtype}: reduce exactly their elements, in "
                "their own dtype (a wider dtype costs more bytes, a narrower one loses "
                "precision).")
    return None


EXERCISES = (
    Exercise(
        name="03b.all_reduce_list",
        notebook="03b_collectives_in_practice",
        summary="my_all_reduce_list(tensors): every tensor summed over the ranks, with one "
                "all_reduce",
        hint="one collective takes one tensor: make one tensor that holds every element of "
             "the list (section 3's trick), reduce it once, then give each input its own "
             "part back, in its own shape.",
        recipe="flat = torch.cat([t.reshape(-1) for t in tensors]); dist.all_reduce(flat); "
               "parts = flat.split([t.numel() for t in tensors]); return [part.view_as(t) "
               "for part, t in zip(parts, tensors)].",
        solution=all_reduce_list,
        checker=check_all_reduce_list,
        answered_by=("ddp_lab.course.ch03_collectives.costs:cat_all_gather",),
    ),
)
