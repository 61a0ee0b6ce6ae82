"""The from-scratch tensor-parallel layers and pipeline stages against one process: same
outputs and gradients on 1-4 real ranks; the schedules' order, and bad sizes refused."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn

import ddp_lab
from ddp_lab import scratch
from ddp_lab.course.ch11_meshes import pipeline, tensor_parallel
from ddp_lab.scratch.pipeline import gpipe_schedule, one_f_one_b_schedule

pytestmark = pytest.mark.timeout(180)


def run(fn, world_size, *args):
    return ddp_lab.run(fn, world_size=world_size, args=args, echo=False).values


@pytest.mark.parametrize("world", [1, 2, 4])
def test_column_then_row_parallel_equals_the_unsharded_mlp(world):
    reference = tensor_parallel.unsharded()
    for rank, got in enumerate(run(tensor_parallel.scratch_tp, world)):
        torch.testing.assert_close(got["out"], reference["out"], msg=f"rank {rank}")
        torch.testing.assert_close(got["x_grad"], reference["x_grad"], msg=f"rank {rank}")
        torch.testing.assert_close(got["grads"], reference["grads"], msg=f"rank {rank}")
        assert got["local_shapes"]["0.weight"] == (64 // world, 16)
        assert [name for name, _ in got["forward"]] == ["allreduce_"]   # one all-reduce each way
        assert [name for name, _ in got["backward"]] == ["allreduce_"]


def _uneven_split():
    try:
        scratch.ColumnParallelLinear(nn.Linear(4, 5))
    except ValueError as err:
        return str(err)


def test_a_layer_that_does_not_split_is_refused():
    message = run(_uneven_split, 2)[0]
    assert "does not split over 2 ranks" in message


@pytest.mark.parametrize("stages", [2, 3, 4])
def test_both_schedules_give_one_process_gradients(stages):
    config = pipeline.PipeConfig(width=16, layers_per_stage=1, microbatches=5, microbatch_rows=3)
    reference = pipeline.reference(config, stages)
    results = run(pipeline.pipeline_step, stages, config)
    for schedule in ("GPipe", "1F1B"):
        assert results[-1][schedule]["loss"] == pytest.approx(reference["loss"], rel=1e-6)
        for stage, r in enumerate(results):
            torch.testing.assert_close(r[schedule]["grads"], reference["grads"][stage])
            assert len(r[schedule]["timeline"]) == 2 * config.microbatches
        assert [r["GPipe"]["peak_in_flight"] for r in results] == [5] * stages
        assert [r["1F1B"]["peak_in_flight"] for r in results] == [min(stages - s, 5) for s in range(stages)]


@pytest.mark.parametrize("stages,microbatches", [(2, 4), (4, 4), (4, 2), (3, 6)])
def test_every_schedule_runs_each_microbatch_forward_then_backward(stages, microbatches):
    for make in (gpipe_schedule, one_f_one_b_schedule):
        for stage in range(stages):
            steps = make(stages, microbatches, stage)
            assert sorted(steps) == sorted([("F", i) for i in range(microbatches)]
                                           + [("B", i) for i in range(microbatches)])
            for i in range(microbatches):
                assert steps.index(("F", i)) < steps.index(("B", i))


def test_one_f_one_b_alternates_after_its_warm_up():
    assert one_f_one_b_schedule(4, 4, 0) == [("F", 0), ("F", 1), ("F", 2), ("F", 3), ("B", 0),
                                             ("B", 1), ("B", 2), ("B", 3)]
    assert one_f_one_b_schedule(4, 6, 2) == [("F", 0), ("F", 1), ("B", 0), ("F", 2), ("B", 1),
                                             ("F", 3), ("B", 2), ("F", 4), ("B", 3), ("F", 5),
                                             ("B", 4), ("B", 5)]
    assert pipeline.expected_bubble(4, 4) == pytest.approx(3 / 7)
