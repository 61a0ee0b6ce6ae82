"""Notebook 03's collectives on real ranks, compared with the single-process math."""

from __future__ import annotations


import matplotlib
import pytest
import torch

import ddp_lab
from ddp_lab.course.ch03_collectives import collectives as C
from ddp_lab.course.ch03_collectives import reference as ref
from ddp_lab.course.ch03_collectives import support
from ddp_lab.course.ch03_collectives import plots as pictures

pytestmark = pytest.mark.timeout(120)

# Sizes that divide by no world size from 2 to 4, for the collectives that accept unequal parts.
UNEVEN = {"reduce_scatter": 5, "all_to_all_single": 7}


def every_collective(dtype: str) -> list[dict]:
    """Each collective with its demo's sizes, then with UNEVEN sizes where they apply."""
    return [{name: demo(dtype=dtype, **({"numel": numel[name]} if name in numel else {}))
             for name, demo in C.COLLECTIVES.items()} for numel in ({}, UNEVEN)]


def reduce_with_every_op() -> dict:
    ops = {"float32": ["SUM", "PRODUCT", "MIN", "MAX", "AVG"],
           "int64": ["SUM", "PRODUCT", "MIN", "MAX", "BAND", "BOR", "BXOR"]}
    return {(name, op, dtype): C.COLLECTIVES[name](dtype=dtype, op=op)
            for dtype in ops for op in ops[dtype] for name in sorted(C.REDUCING)}


# --- the reference math itself, without processes --------------------------------------------

def test_reference_math_by_hand():
    befores = [C.rank_values(r, 3) for r in range(4)]
    assert ref.expected("all_reduce", befores)[2].tolist() == [64, 68, 72]
    at_root, *others = ref.expected("reduce", befores, op="MAX")
    assert at_root.tolist() == [31, 32, 33] and others == [ref.ANY] * 3
    assert ref.expected("gather", befores)[1:] == [None] * 3
    parts = [list(C.rank_values(r, 5).tensor_split(2)) for r in range(2)]
    assert [t.tolist() for t in ref.expected("reduce_scatter", parts)] == [[12, 14, 16], [18, 20]]
    assert ref.expected("all_to_all", [["a0", "a1"], ["b0", "b1"]]) == [["a0", "b0"], ["a1", "b1"]]
    assert ref.combine([torch.tensor([6]), torch.tensor([3])], "BXOR").tolist() == [5]
    assert ref.combine([torch.tensor([1], dtype=torch.int32)] * 2, "SUM").dtype == torch.int32


def test_check_names_the_rank_that_breaks_the_math():
    results = [{"before": C.rank_values(r, 2), "after": C.rank_values(r, 2)} for r in range(2)]
    with pytest.raises(AssertionError, match="broadcast on 2 ranks, rank 1"):
        ref.check("broadcast", results)


# --- every collective on 1 to 4 real ranks --------------------------------------------------

@pytest.mark.parametrize("world_size", [1, 2, 3, 4])
@pytest.mark.parametrize("dtype", ["int64", "int32", "float32"])
def test_every_collective_matches_reference(world_size, dtype):
    res = ddp_lab.run(every_collective, world_size, args=(dtype,), echo=False)
    for sizes in range(2):
        for name in C.COLLECTIVES:
            results = [v[sizes][name] for v in res.values]
            assert all(torch.equal(r["before"], C.rank_values(rank, r["before"].numel(), dtype))
                       for rank, r in enumerate(results) if isinstance(r["before"], torch.Tensor))
            ref.check(name, results)


@pytest.mark.parametrize("world_size", [1, 2, 3, 4])
def test_reducing_collectives_with_every_op(world_size):
    res = ddp_lab.run(reduce_with_every_op, world_size, echo=False)
    for name, op, dtype in res.values[0]:
        ref.check(name, [v[name, op, dtype] for v in res.values], op=op)


def test_reduce_op_table_tries_every_op():
    table = ddp_lab.run(support.try_reduce_ops, 3, echo=False).values[0]
    assert set(table) == {(op, d) for op in support.REDUCE_OPS for d in ("float32", "int64")}
    befores = {d: [C.rank_values(r, 3, d) for r in range(3)] for d in ("float32", "int64")}
    for (op, dtype), value in table.items():
        if op in ("SUM", "PRODUCT", "MIN", "MAX"):
            assert isinstance(value, list), f"{op} {dtype}: {value}"
        if isinstance(value, list) and op != "PREMUL_SUM":
            torch.testing.assert_close(torch.tensor(value, dtype=getattr(torch, dtype)),
                                       ref.combine(befores[dtype], op))
    assert "BAND" in table["BAND", "float32"]  # bitwise on floats: an error, not a number
    assert support.reduce_op_markdown(table).count("\n") == len(support.REDUCE_OPS) + 1


@pytest.mark.parametrize("world_size", [1, 2, 3, 4])
def test_equivalents_built_from_other_collectives(world_size):
    for worker in (support.reduce_scatter_via_all_reduce, support.all_to_all_via_scatter):
        for value in ddp_lab.run(worker, world_size, echo=False).values:
            torch.testing.assert_close(value["equivalent"], value["builtin"])


def test_all_to_all_with_unequal_parts_is_refused_clearly_or_correct():
    try:
        res = ddp_lab.run(support.all_to_all_unequal, 3, echo=False)
    except ddp_lab.WorkerError as err:  # gloo today: a size check before anything is sent
        assert "alltoall: invalid tensor size" in err.traceback
    else:
        ref.check("all_to_all", res.values)


def test_five_collectives_prints_and_returns_the_classic_example_values():
    five = ddp_lab.run(C.five_collectives, 3, echo=False)
    assert [v["all_reduce"] for v in five.values] == [33, 33, 33]
    assert [v["reduce"] for v in five.values] == [33, None, None]
    assert "rank: 2, 2" in five.logs[2] and "dist.is_available: True" in five.logs[0]



# --- the pictures, drawn from real results ----------------------------------------------------

def rank_labels(fig) -> list[str]:
    return [t.get_text() for t in fig.axes[0].texts if t.get_text().startswith("rank ")]


@pytest.mark.parametrize("world_size", [1, 3])
def test_tour_matches_and_draws_one_row_per_rank_for_every_collective(world_size):
    matplotlib.use("Agg")
    res = ddp_lab.run(C.tour, world_size, echo=False)
    for name in C.COLLECTIVES:
        assert "error" not in res.values[0][name], res.values[0][name]
        ref.check(name, [v[name] for v in res.values])
        fig = pictures.results_picture(name, [v[name] for v in res.values])
        assert rank_labels(fig) == [f"rank {r}" for r in range(world_size)], name
        fig.canvas.draw()  # renders without error
    values_drawn = [t.get_text() for t in
                    pictures.results_picture("gather", [v["gather"] for v in res.values])
                    .axes[0].texts]
    assert values_drawn.count("—") == world_size - 1  # non-root ranks of gather hold nothing


def test_timing_bars_one_bar_per_case():
    fig = pictures.timing_bars({"a": 0.001, "b": 0.002, "c": 0.0005}, "title")
    assert len(fig.axes[0].patches) == 3 and fig.axes[0].get_title() == "title"


def test_gloo_reduce_scatter_is_an_all_reduce_underneath():
    underneath = ddp_lab.run(support.reduce_scatter_underneath, 3, echo=False)[0]
    assert underneath == {"reduce_scatter_single": ["gloo:all_reduce"],
                          "reduce_scatter": ["gloo:all_reduce"] * 3}


def test_float_sums_depend_on_the_order_but_every_rank_gets_the_same_bits():
    per_rank = ddp_lab.run(support.float_sums, 4, echo=False).values
    orders = support.sums_in_orders(per_rank)
    assert (orders["ranks 0..N-1"] != orders["ranks N-1..0"]).any()
    bound = support.rounding_bound(per_rank)
    assert all(((orders[a] - orders[b]).abs() <= bound).all() for a in orders for b in orders)
    assert all(torch.equal(r["all_reduce"], per_rank[0]["all_reduce"]) for r in per_rank)
    exact = support.sums_in_orders([{"mine": torch.tensor([float(k)]), "all_reduce": None}
                                    for k in range(3)])
    assert exact["ranks 0..N-1"].item() == exact["pairwise"].item() == 3.0
