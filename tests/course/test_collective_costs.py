"""Notebook 03's measurements and pitfalls on real ranks: same results, every case timed,
and each mismatched shape failing the way the notebook says."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

import ddp_lab
from ddp_lab.course.ch03_collectives import costs

pytestmark = pytest.mark.timeout(120)


def test_object_collectives_carry_objects_of_any_size():
    objs = ddp_lab.run(costs.object_collectives, 3, echo=False).values
    assert all(v["all_gather_object"][2]["words"] == ["tok"] * 3 for v in objs)
    assert [v["gather_object"] is None for v in objs] == [False, True, True]
    assert objs[1]["broadcast_object_list"] == {"lr": 0.1, "seed": 1234}


def gather_lists(shapes: list) -> dict:
    rank = dist.get_rank()
    tensors = [torch.full(shape, 100.0 * rank + i) for i, shape in enumerate(shapes)]
    return {"cat": costs.cat_all_gather(tensors), "each": costs.all_gather_each(tensors)}


@pytest.mark.parametrize("world_size", [1, 2, 3, 4])
def test_cat_trick_equals_one_all_gather_per_tensor(world_size):
    shapes = [(1, 2), (3,), (2, 2), ()]
    res = ddp_lab.run(gather_lists, world_size, args=(shapes,), echo=False)
    for value in res.values:
        expected = [[torch.full(s, 100.0 * r + i) for i, s in enumerate(shapes)]
                    for r in range(world_size)]
        torch.testing.assert_close(value["cat"], expected)
        torch.testing.assert_close(value["each"], expected)


def test_measurements_return_every_case_without_judging_speed():
    cost = ddp_lab.run(costs.object_vs_tensor_cost, 2, kwargs={"numel": 100, "repeats": 1},
                       echo=False).values[0]
    assert len(cost) == 4 and all(s > 0 for s in cost.values())
    trick = ddp_lab.run(costs.list_gather_cost, 2, kwargs={"count": 5, "repeats": 1},
                        echo=False).values[0]
    assert trick["same_result"] and len(trick["seconds"]) == 2
    overlap = ddp_lab.run(costs.async_overlap, 2, kwargs={"numel": 1000, "compute_s": 0.001,
                                                          "repeats": 1}, echo=False).values[0]
    assert len(overlap) == 7 and all(s > 0 for s in overlap.values())


def test_barrier_and_in_place():
    bar = ddp_lab.run(costs.barrier_release, 3, kwargs={"step_s": 0.05}, echo=False).values
    assert min(v["left"] for v in bar) >= max(v["arrived"] for v in bar)
    ip = ddp_lab.run(costs.in_place, 2, echo=False).values
    assert ip[1]["returned"] is None and ip[1]["input_after"].tolist() == [12, 14, 16]


@pytest.mark.timeout(60)
def test_mismatched_shapes_error_silently_crash_or_hang():
    outcomes = costs.try_mismatches(world_size=2, timeout=2)
    assert {case: o for case, (o, _) in outcomes.items()} == {
        "all_gather": "error", "broadcast from rank 0": "no error",
        "broadcast from the last rank": "crash", "all_reduce": "hang",
        "all_reduce, float32 vs int32": "no error", "all_reduce, DETAIL debug": "error"}
    assert "shapes" in outcomes["all_reduce, DETAIL debug"][1]


def test_a_dtype_mismatch_of_one_element_size_is_silent_and_wrong():
    """float32 on rank 0, int32 on rank 1, same shape: no error, and the ranks end with
    different values, neither of them the sum [2, 4, 6, 8]."""
    f32, i32 = ddp_lab.run(costs.mismatched, 2, args=("all_reduce, float32 vs int32",),
                           echo=False, timeout=20).values
    assert all(isinstance(v, float) for v in f32) and all(isinstance(v, int) for v in i32)
    assert f32 != i32 and f32 != [2.0, 4.0, 6.0, 8.0] and i32 != [2, 4, 6, 8]


def test_detail_adds_a_monitored_barrier_and_two_all_gathers_per_collective():
    values = ddp_lab.run(costs.detail_check_calls, 3, echo=False).values
    for rank, calls in enumerate(values):
        assert calls["plain"] == ["gloo:all_reduce"]
        assert calls["DETAIL"].count("gloo:all_gather") == 2
        assert calls["DETAIL"].count("gloo:all_reduce") == 1
        # the monitored barrier: rank 0 hears from every other rank and answers each
        assert calls["DETAIL"].count("gloo:send") == calls["DETAIL"].count("gloo:recv") == (
            2 if rank == 0 else 1)


def test_an_object_collective_runs_two_all_gathers_of_more_bytes():
    traffic = ddp_lab.run(costs.object_vs_tensor_traffic, 3, kwargs={"numel": 1000},
                          echo=False).values[0]
    assert traffic["all_gather(tensor)"] == (1, 3 * 1000 * 4)
    assert traffic["all_gather_object(list of floats)"][0] == 2
    assert traffic["all_gather_object(list of floats)"][1] > 2 * 3 * 1000 * 4
    assert traffic["pickle.dumps + loads only"] == (0, 0)
