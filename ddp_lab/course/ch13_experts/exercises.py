"""Notebook 13's exercise: the dispatch of expert parallelism, a variable all-to-all whose
split sizes the ranks must exchange first.

The learner writes ``dispatch(rows, counts)``: ``rows`` sorted by destination rank and then
by that rank's local expert, ``counts[j, e]`` of them for expert ``e`` of rank ``j``. It
returns the rows this rank receives (by source rank, then expert) and ``got[j, e]``, how
many came from rank ``j`` for its own expert ``e``. The check runs it on 1 to 4 ranks with
random counts (zeros included) and random row widths, with ``scratch.moe.dispatch``
switched off, and compares with what every rank sent.
"""

from __future__ import annotations

import importlib

import torch
import torch.distributed as dist

from ddp_lab.exercises.builtins_off import refusing, replaced
from ddp_lab.exercises.driver import WORLD_SIZES, generator, new_seed, run_ranks, where
from ddp_lab.exercises.registry import Exercise, ExerciseFailed
from ddp_lab.scratch.moe import dispatch

CHECK_TIMEOUT = 60.0


def _shapes(seed: int) -> tuple[int, int]:
    g = generator(seed)
    local_experts = int(torch.randint(2, 4, (1,), generator=g))  # 2+: the order within a source shows
    return local_experts, int(torch.randint(1, 4, (1,), generator=g))


def _inputs(seed: int, rank: int, world: int):
    local_experts, width = _shapes(seed)
    g = generator(seed, rank)
    counts = torch.randint(0, 4, (world, local_experts), generator=g)
    return torch.randn(int(counts.sum()), width, generator=g), counts


def _trial(fn, seed: int):
    rank, world = dist.get_rank(), dist.get_world_size()
    rows, counts = _inputs(seed, rank, world)
    moe = importlib.import_module("ddp_lab.scratch.moe")
    why = "write the dispatch yourself from all_to_all_single"
    with replaced(moe, "dispatch", refusing("scratch.moe.dispatch", why)):
        return fn(rows, counts)


def _expected(seed: int, world: int, rank: int):
    """What rank ``rank`` must receive: each source's rows for it, in source order."""
    arrived, got = [], []
    for source in range(world):
        rows, counts = _inputs(seed, source, world)
        start = int(counts[:rank].sum())
        arrived.append(rows[start:start + int(counts[rank].sum())])
        got.append(counts[rank])
    own_rows, own_counts = _inputs(seed, rank, world)
    return {"arrived": torch.cat(arrived), "got": torch.stack(got),
            "own_rows": own_rows, "own_counts": own_counts}


def _same(a, b) -> bool:
    return isinstance(a, torch.Tensor) and a.shape == b.shape and torch.equal(a, b)


def _problem(value, want: dict) -> str | None:
    if not (isinstance(value, (tuple, list)) and len(value) == 2):
        return f"return (arrived, got): two tensors, got {type(value).__name__}"
    arrived, got = value
    if not _same(arrived, want["arrived"]):
        if _same(arrived, want["own_rows"]) and not _same(want["own_rows"], want["arrived"]):
            return ("these are this rank's own rows: each block of rows must travel to its rank "
                    "(all_to_all_single with input_split_sizes = counts.sum(1))")
        if (isinstance(arrived, torch.Tensor) and arrived.shape == want["arrived"].shape
                and _same(_sorted_rows(arrived), _sorted_rows(want["arrived"]))):
            return ("the right rows in the wrong order: keep the order of arrival, by source "
                    "rank and then expert (the experts' code reads them that way with got)")
        return (f"the rows received differ from what the other ranks sent this rank "
                f"({len(want['arrived'])} rows expected): exchange the counts first, then pass "
                "output_split_sizes = got.sum(1) and input_split_sizes = counts.sum(1)")
    if not _same(got, want["got"]):
        if _same(got, want["own_counts"]):
            return ("got is what this rank sent (counts); it must say what it received: "
                    "exchange the counts with an all_to_all_single of the counts tensor")
        return f"got should be {want['got'].tolist()} (rows from rank j for expert e), got {got}"
    return None


def _sorted_rows(rows: torch.Tensor) -> torch.Tensor:
    return rows[torch.argsort(rows[:, 0], stable=True)] if len(rows) else rows


def check_dispatch(fn) -> str:
    seed = new_seed()
    for n in WORLD_SIZES:
        on = where(n, seed)
        values = run_ranks(_trial, n, (fn, seed), where=on, timeout=CHECK_TIMEOUT,
                           hang_hint="Every rank must make the same all-to-alls, with split "
                                     "sizes that agree pair by pair (exchange them first).")
        for rank, value in enumerate(values):
            problem = _problem(value, _expected(seed, n, rank))
            if problem:
                raise ExerciseFailed(f"{on}, rank {rank}: {problem}")
    return (f"every rank received exactly the rows sent to it, in order, and the counts, on 1 "
            f"to 4 ranks with {_shapes(seed)[0]} experts per rank (seed {seed})")


EXERCISES = (
    Exercise(
        name="13.dispatch", notebook="13_expert_parallelism",
        summary="dispatch(rows, counts): exchange the split sizes, then a variable all_to_all_single",
        hint="Tell each rank what is coming first (an all-to-all of the counts), then move the "
             "rows with all_to_all_single's output and input split sizes.",
        solution=dispatch, checker=check_dispatch,
        answered_by=("ddp_lab.scratch.moe:_Dispatch",)),
)
