"""Notebook 13's exercise: the dispatch of expert parallelism, a variable all-to-all whose
split sizes the ranks must exchange first.

The learner writes ``dispatch(rows, counts)``: ``rows`` sorted by destination rank and then
by that rank's local expert, ``counts[j, e]`` of them for expert ``e`` of rank ``j``. It
returns the rows this rank receives (by source rank, then expert) and ``got[j, e]``, how
many came from rank ``j`` for its own expert ``e``. The check runs it on 1 to 4 ranks with
random counts (zeros included, a rank that receives nothing, a rank that sends nothing, each
rank sending most of its rows to one other rank), random row widths and float32 or float64
rows, with ``scratch.moe``'s dispatch switched off however it is imported. The inputs are made
in the checker's process and each rank is dealt only its own; what came back is compared there
with what every rank sent. Then the cost, as CollectiveTrace records it whatever form the
collectives took: the counts' exchange plus the rows once (one variable all-to-all, or
point-to-point messages of the same bytes), neither more (padding every block to the largest,
or sending every rank every row) nor less (the rows must travel by the collectives).
"""

from __future__ import annotations

import contextlib
import importlib
import pickle

import torch

from ddp_lab.course.collective_trace import CollectiveTrace
from ddp_lab.exercises.builtins_off import refused_everywhere, refusing, replaced
from ddp_lab.exercises.driver import each_world, generator, new_seed, tensor_problem
from ddp_lab.exercises.registry import Exercise
from ddp_lab.exercises.sealed import deal
from ddp_lab.scratch.moe import dispatch

COST_TOLERANCE = 1.25  # over the reference's rows; the counts may travel by all-gather too


def _shapes(seed: int) -> tuple[int, int]:
    """Local experts (2+: the order within a source shows) and the rows' width (4-8: the
    rows, not the counts, are what costs)."""
    g = generator(seed)
    local_experts = int(torch.randint(2, 4, (1,), generator=g))
    return local_experts, int(torch.randint(4, 9, (1,), generator=g))


def _inputs(seed: int, rank: int, world: int):
    """0-2 rows per expert of every rank, 4-7 more for each expert of one rank, on 2+ ranks
    none at all for the last rank, and on 3+ ranks none at all from rank 1: uneven blocks, an
    empty one, a rank receiving none, a rank sending none (an empty ``rows``). The rows are
    float64 on an odd world size, float32 on an even one: a receive buffer made in the
    default dtype (``torch.empty(n, width)``) fails every check, not only where rows are
    float64."""
    local_experts, width = _shapes(seed)
    g = generator(seed, rank)
    counts = torch.randint(0, 3, (world, local_experts), generator=g)
    if world > 1:
        counts[(rank + 1) % (world - 1)] += torch.randint(4, 8, (local_experts,), generator=g)
        counts[world - 1] = 0
    if world > 2 and rank == 1:
        counts.zero_()
    dtype = (torch.float32, torch.float64)[world % 2]
    return torch.randn(int(counts.sum()), width, generator=g, dtype=dtype), counts


def _dealt(seed: int, world: int):
    """Made here, in the checker's process: each rank gets its own rows and counts only."""
    return deal([_inputs(seed, rank, world) for rank in range(world)])


def _switched_off():
    """scratch.moe's dispatch, its helper and its autograd function refuse, however they are
    imported (the reference too: a solved cell is its own function)."""
    moe = importlib.import_module("ddp_lab.scratch.moe")
    why = "write the dispatch yourself from the collectives"
    stack = contextlib.ExitStack()
    stack.enter_context(replaced(moe._Dispatch, "forward", staticmethod(
        refusing("scratch.moe._Dispatch", why))))
    stack.enter_context(refused_everywhere(moe.all_to_all, "scratch.moe.all_to_all", why))
    stack.enter_context(refused_everywhere(dispatch, "scratch.moe.dispatch", why))
    return stack


# What gloo and torch say when the sizes of a variable all-to-all do not fit, and what it means
# (distributed_c10d.all_to_all_single; gloo/alltoall.cc enforces equal sizes without splits;
# ProcessGroupGloo::alltoall checks that a list's blocks all have the first one's size).
SIZE_ERRORS = {
    "Split sizes doesn't match": "the split sizes do not add up to the tensors: the output "
    "split sizes must sum to the rows that arrive (what the others send here, the exchanged "
    "counts summed per source) and the input split sizes to this rank's rows (counts.sum(1))",
    "in->size == out->size": "without split sizes, all_to_all_single cuts both tensors into "
    "equal parts, and gloo needs the input and the output of the same size; these blocks "
    "differ from rank to rank, so pass output_split_sizes and input_split_sizes",
    "invalid tensor size": "gloo's list form, dist.all_to_all(output_list, input_list), "
    "needs every block the same size (ProcessGroupGloo::alltoall; NCCL takes blocks of any "
    "size): blocks of different sizes go through all_to_all_single on one tensor each way, "
    "with output_split_sizes (what each rank sends here) and input_split_sizes (this rank's "
    "rows per destination)",
    "different dtypes": "a receive buffer must have the dtype of what it receives: "
    "rows.new_empty((n, rows.shape[1])) for the rows (they are not always float32), "
    "torch.empty_like(counts) for the counts (integers, not floats)",
    "LengthPerRank": "the split sizes disagree pair by pair: what this rank expects from rank "
    "j (output_split_sizes[j]) must be what rank j sends it (its input_split_sizes for this "
    "rank); the exchanged counts, summed per source in rank order, give exactly that",
}


def _call(fn, rows, counts):
    """The learner's dispatch; a size error of the all-to-all is explained in words."""
    try:
        return fn(rows, counts)
    except (RuntimeError, ValueError) as err:
        for phrase, meaning in SIZE_ERRORS.items():
            if phrase in str(err):
                raise type(err)(f"{err}\n{meaning}") from err
        raise


def _trial(fn, dealt) -> dict:
    """This rank's rows and counts (from the checker's process), the learner's dispatch on
    them, what came back and what travelled; nothing of the expectation is here."""
    rows, counts = dealt.take()
    with _switched_off(), CollectiveTrace() as trace:
        value = _call(fn, rows, counts)
    calls = trace.moving_data()
    rows_like = [c for c in calls if c.dtype == rows.dtype]
    narrow = [c for c in calls if c.dtype is not None and c.dtype.is_floating_point
              and c.dtype.itemsize < rows.element_size()]
    return {"value": value,  # rows travel in their dtype; counts as integers, objects as bytes
            "rows_bytes": _rows_bytes(rows_like),
            "other_bytes": sum(c.whole_nbytes for c in calls if c not in rows_like),
            "families": trace.family_counts(),
            "narrow": {str(c.dtype): sum(d.whole_nbytes for d in narrow if d.dtype == c.dtype)
                       for c in narrow}}


def _rows_bytes(calls: list) -> int:
    """The bytes of rows that one rank's collectives concern, each row once: an all-to-all's
    larger side (what goes in or what comes out), and of point-to-point messages the larger
    of what this rank sent and what it received (a sent row is another rank's received row:
    summing both counts each row twice)."""
    sent = sum(c.whole_nbytes for c in calls if c.family == "send")
    received = sum(c.whole_nbytes for c in calls if c.family == "recv")
    rest = sum(c.whole_nbytes for c in calls if c.family not in ("send", "recv"))
    return rest + max(sent, received)


def _expected(seed: int, world: int, rank: int):
    """What rank ``rank`` must receive: each source's rows for it, in source order."""
    arrived, got = [], []
    for source in range(world):
        rows, counts = _inputs(seed, source, world)
        start = int(counts[:rank].sum())
        arrived.append(rows[start:start + int(counts[rank].sum())])
        got.append(counts[rank])
    own_rows, own_counts = _inputs(seed, rank, world)
    received, itemsize = torch.cat(arrived), own_rows.element_size()
    kept = int(own_counts[rank].sum()) * own_rows.shape[1]  # its own block stays here
    return {"arrived": received, "got": torch.stack(got), "own_rows": own_rows,
            "own_counts": own_counts, "counts_allowance": _counts_allowance(own_counts, world),
            "row_bytes": itemsize * max(own_rows.numel(), received.numel()),
            # every rank's counts in a float or int64 tensor, all-gathered: the most that
            # counts exchanged in a float buffer can weigh
            "counts_as_tensor": world * own_counts.numel() * 8,
            "counts_as_rows": world * own_counts.numel() * itemsize,
            "least_row_bytes": itemsize * max(own_rows.numel(), received.numel()) - itemsize * kept}


def _counts_allowance(counts: torch.Tensor, world: int) -> float:
    """What the counts may cost: an all-to-all of them, an all-gather of every rank's, or
    all_gather_object (every rank's pickled counts plus their sizes, as torch's
    ``_object_to_tensor`` sends them, distributed_c10d.py), whichever is largest."""
    pickled = len(pickle.dumps(counts))
    return max((world + 1) * counts.numel() * 8, world * (1.25 * pickled + 8))


def _same(a, b) -> bool:
    """The same dtype, shape and values (torch.equal alone says a float tensor equals an
    integer one with the same values)."""
    return (isinstance(a, torch.Tensor) and a.dtype == b.dtype and a.shape == b.shape
            and torch.equal(a, b))


def _problem(result: dict, want: dict, world: int) -> str | None:
    value = result["value"]
    if not (isinstance(value, (tuple, list)) and len(value) == 2):
        return f"return (arrived, got): two tensors, got {type(value).__name__}"
    # counts exchanged in a float32 buffer beside float64 rows are no narrowed rows
    narrow = [dtype for dtype, size in result["narrow"].items()
              if dtype != "torch.float32" or size > want["counts_as_tensor"]]
    if narrow:
        return (f"the rows travelled as {', '.join(narrow)}: send them in their own "
                f"dtype ({want['own_rows'].dtype}); a narrower one rounds them and only looks "
                "cheaper")
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
                f"({tensor_problem(arrived, want['arrived'], mine=want['own_rows'])}): exchange "
                "the counts first, then pass output_split_sizes = got.sum(1) and "
                "input_split_sizes = counts.sum(1)")
    if isinstance(got, torch.Tensor) and got.dtype != want["got"].dtype:
        return (f"got is {got.dtype}; it must be {want['got'].dtype} like counts: counts are "
                "integers, and a float buffer rounds them above 2**24 (float32): exchange them "
                "into torch.empty_like(counts)")
    if not _same(got, want["got"]):
        if _same(got, want["own_counts"]):
            return ("got is what this rank sent (counts); it must say what it received: "
                    "exchange the counts with an all_to_all_single of the counts tensor")
        return (f"got must say how many rows came from rank j for expert e: "
                f"{tensor_problem(got, want['got'])}")
    return _cost_problem(result, want, world) if world > 1 else None


def _cost_problem(result: dict, want: dict, world: int) -> str | None:
    """The rows (what travels in their dtype) once, by one variable all-to-all; everything
    else (the counts, as integers or as pickled objects) within what exchanging the counts
    costs."""
    if result["other_bytes"] > want["counts_allowance"]:
        return (f"the right rows, but besides them {result['other_bytes']} bytes travelled "
                f"({result['families']}), where exchanging the counts costs at most "
                f"{want['counts_allowance']:.0f}: each row travels once, to its rank only "
                "(sending every rank's rows to every rank, as objects or otherwise, costs "
                "all of them)")
    # counts exchanged in the rows' dtype (a float buffer) travel with them
    if result["rows_bytes"] > COST_TOLERANCE * want["row_bytes"] + want["counts_as_rows"]:
        return (f"the right rows, but {result['rows_bytes']} bytes of rows moved "
                f"({result['families']}); one all-to-all with the exchanged split sizes "
                f"moves {want['row_bytes']}: each row travels once, to its rank only, in a "
                "block of its own size (no padding to the largest block)")
    if result["rows_bytes"] < 0.99 * want["least_row_bytes"]:
        return (f"the right rows, but only {result['rows_bytes']} bytes of rows moved "
                f"({result['families'] or 'no collective'}), where the rows that leave this "
                f"rank or reach it from the others take {want['least_row_bytes']}: they "
                "must travel by the collectives themselves, whole and in their own dtype")
    return None


def _sorted_rows(rows: torch.Tensor) -> torch.Tensor:
    return rows[torch.argsort(rows[:, 0], stable=True)] if len(rows) else rows


def check_dispatch(fn) -> str:
    seed = new_seed()
    each_world(_trial, lambda n: (fn, _dealt(seed, n)),
               lambda value, rank, n: _problem(value, _expected(seed, n, rank), n), seed,
               hang_hint="Every rank must make the same all-to-alls, with split sizes that "
                         "agree pair by pair (exchange them first).")
    return (f"every rank received exactly the rows sent to it, in order, and the counts, on 1 "
            f"to 4 ranks with {_shapes(seed)[0]} experts per rank (seed {seed})")


EXERCISES = (
    Exercise(
        name="13.dispatch", notebook="13_expert_parallelism",
        summary="dispatch(rows, counts): exchange the split sizes, then a variable all_to_all_single",
        hint="No rank knows how many rows it will receive until the others tell it: that is "
             "a first exchange, of the counts. Then one collective can move blocks of "
             "different sizes to each rank, if it is told the sizes on both sides.",
        recipe="1. got = torch.empty_like(counts); dist.all_to_all_single(got, counts): row j "
               "of counts goes to rank j, so got[j] is what rank j sends here.\n2. arrived = "
               "rows.new_empty((int(got.sum()), rows.shape[1])).\n3. "
               "dist.all_to_all_single(arrived, rows, output_split_sizes=got.sum(1).tolist(), "
               "input_split_sizes=counts.sum(1).tolist()).\n4. return arrived, got.",
        solution=dispatch, checker=check_dispatch,
        answered_by=("ddp_lab.scratch.moe:_Dispatch",)),
)
