"""Notebook 11's demos on real ranks: the 2 x 2 mesh's groups and a two-hop all-reduce,
each redistribute's collective, torch's tensor parallel against the unsharded MLP, 2-D
training against one process, and the figures."""

from __future__ import annotations

import pytest
import torch
from matplotlib.figure import Figure

import ddp_lab
from ddp_lab.course.ch11_meshes import meshes, pipeline, placements, plots, tensor_parallel, two_d

pytestmark = pytest.mark.timeout(240)


def run(fn, world_size, *args):
    return ddp_lab.run(fn, world_size=world_size, args=args, echo=False).values


def test_mesh_groups_and_hierarchical_all_reduce():
    values = run(meshes.tour, 4)
    assert [v["groups"]["tp"] for v in values] == [[0, 1], [0, 1], [2, 3], [2, 3]]
    assert [v["groups"]["dp"] for v in values] == [[0, 2], [1, 3], [0, 2], [1, 3]]
    for v in values:
        a = v["all_reduce"]
        assert torch.equal(a["after_dp"], a["flat"]) and a["flat"][0] == 1111
        assert [g for _, _, g in a["calls"]] == [2, 2]
        assert torch.equal(a["rs_ar_ag"], a["flat"])           # RS -> AR(shard) -> AG
        assert [(n, g) for n, _, g in a["rs_calls"]] == [
            ("_reduce_scatter_base_", 2), ("allreduce_", 2), ("_allgather_base_", 2)]
        assert a["rs_calls"][1][1] * 2 == a["calls"][1][1]     # the "dp" hop: half the bytes
    assert isinstance(plots.mesh_picture(values), Figure)


def test_a_mesh_needs_the_right_number_of_ranks():
    with pytest.raises(ddp_lab.WorkerError, match="needs 4 ranks"):
        run(meshes.mesh_groups, 2)


def test_each_redistribute_runs_its_collective():
    values = run(placements.redistributions, 4)
    ops = {name: [c for c, _, _ in values[0][name]["calls"]] for name, _, _ in placements.TRANSITIONS}
    assert ops == {"Shard(0) -> Replicate": ["all_gather_into_tensor"],
                   "Partial -> Replicate": ["all_reduce"],
                   "Partial -> Shard(0)": ["reduce_scatter_tensor"],
                   "Shard(0) -> Shard(1)": ["all_gather_into_tensor"],  # gloo: no all_to_all
                   "Replicate -> Shard(0)": []}
    full = placements.global_tensor()
    for rank, v in enumerate(values):
        for name, _, target in placements.TRANSITIONS:
            torch.testing.assert_close(v[name]["global"], full)
            expected = full.chunk(4, dim=target.dim)[rank] if target.is_shard() else full
            torch.testing.assert_close(v[name]["after"], expected)
    assert values[0]["Partial -> Replicate"]["bytes_per_rank"] == 2 * values[0]["Partial -> Shard(0)"]["bytes_per_rank"]
    for v in values:                          # a Partial target is refused (_api.py:714-718)
        assert "redistributing to Partial is for internal use only" in v["Replicate -> Partial"]
    assert isinstance(plots.redistribute_picture(values, "Partial -> Shard(0)"), Figure)


@pytest.mark.parametrize("world", [2, 4])
def test_parallelize_module_equals_the_unsharded_mlp(world):
    reference = tensor_parallel.unsharded()
    for got in run(tensor_parallel.torch_tp, world):
        torch.testing.assert_close(got["out"], reference["out"])
        torch.testing.assert_close(got["x_grad"], reference["x_grad"])
        torch.testing.assert_close(got["grads"], reference["grads"])
        assert [c for c, _ in got["forward"]] == [c for c, _ in got["backward"]] == ["all_reduce"]


def test_data_times_tensor_parallel_equals_one_process():
    reference = two_d.reference()
    for got in run(two_d.train_2d, 4):
        torch.testing.assert_close(got["losses"], reference["losses"])
        torch.testing.assert_close(got["params"], reference["params"])


def test_pipeline_figure_and_bubble_arithmetic():
    results = run(pipeline.pipeline_step, 2, pipeline.PipeConfig(width=32, microbatch_rows=4))
    assert isinstance(plots.pipeline_timelines(results), Figure)
    measured = pipeline.bubble([r["GPipe"]["timeline"] for r in results])
    assert 0.0 <= measured < 1.0
    assert pipeline.bubble([[("F0", 0.0, 1.0)], [("F0", 1.0, 2.0)]]) == pytest.approx(0.5)
