"""Notebook 14's cost model: the calls and state it predicts against real traced steps of
every plan (loopback, a small MLP), its arithmetic on synthetic fits, the paper model's
accounting, and the figures. No timing is asserted here (the notebook states its factor)."""

from __future__ import annotations

import pytest
from matplotlib.figure import Figure

from ddp_lab.course.alpha_beta import AlphaBeta
from ddp_lab.course.ch14_planning import calibrate, costs, experiment, paper, plots, timemodel
from ddp_lab.course.ch14_planning.plans import PLANS, PlanConfig

pytestmark = pytest.mark.timeout(240)

SMALL = PlanConfig(width=36, layers=8, global_batch=16, microbatches=4)


@pytest.fixture(scope="module")
def loopback():
    return experiment.run(None, SMALL)


def test_every_plan_issues_the_predicted_calls_and_holds_the_predicted_state(loopback):
    assert experiment.trace_mismatches(loopback) == []
    assert experiment.state_mismatches(loopback) == []
    assert set(loopback["measured_ms"]) == set(PLANS)


def test_fsdp_regathers_every_weight_but_the_first_in_backward():
    calls = costs.predicted_calls("FSDP", SMALL, 0)
    weight = (36 * 36) * 4  # 1296 elements: divisible by 4, no padding
    bias = 36 * 4
    assert calls.count(("all_gather", weight, 4)) == 2 * SMALL.layers - 1
    assert calls.count(("all_gather", bias, 4)) == SMALL.layers
    assert calls.count(("reduce_scatter", weight, 4)) == SMALL.layers


def test_pipeline_ends_talk_to_one_neighbour_the_middle_to_two():
    counts = [len(costs.predicted_calls("PP", SMALL, r)) for r in range(4)]
    assert counts == [8, 16, 16, 8]


def test_zero1_keeps_adam_state_only_for_what_it_owns():
    total = sum(2 * costs.adam_parameters("ZeRO-1", SMALL, r) * 4 for r in range(4))
    assert total == 2 * sum(costs.param_numels(SMALL)) * 4


def test_comm_seconds_is_alpha_per_call_plus_beta_per_byte():
    fits = {f"{family}/{size}": AlphaBeta(1e-3, 1e-9, 1.0, 0.0) for family, size in calibrate.KINDS}
    calls = costs.predicted_calls("DDP", SMALL, 0)
    expected = len(calls) * 1e-3 + 1e-9 * sum(n for _, n, _ in calls)
    assert timemodel.comm_seconds("DDP", SMALL, fits) == pytest.approx(expected)


def test_fit_recovers_a_line():
    seconds = [2e-3 + 3e-8 * s for s in calibrate.SIZES]
    fit = calibrate.fit({"all_reduce/4": seconds})["all_reduce/4"]
    assert fit.alpha == pytest.approx(2e-3) and fit.beta == pytest.approx(3e-8)


def test_paper_model_accounting():
    job = paper.Job(width=1024, layers=8)
    ddp = paper.plan_at_scale(job, "DDP")
    assert ddp["memory"] >= paper.STATE_BYTES * job.params
    assert paper.ring(100.0, 4, 1.0, 2.0) == 150.0 and paper.ring(100.0, 1, 1.0) == 0.0
    fsdp = paper.plan_at_scale(job, "FSDP")
    assert fsdp["comm"] == pytest.approx(1.5 * ddp["comm"])    # 3 (n-1)/n against 2 (n-1)/n


def test_paper_sweep_crossovers():
    swept = paper.sweep()
    wins = paper.winners(swept)
    assert wins[1024] == "DDP" and "TP64" not in wins.values()
    assert paper.crossovers(swept)[0][1:] == ("DDP", "PP8xDP8")


def test_figures(loopback):
    assert isinstance(plots.fits(loopback), Figure)
    assert isinstance(plots.predicted_vs_measured(loopback, 3.0), Figure)
    assert isinstance(plots.state_per_rank(loopback), Figure)
    assert isinstance(plots.cluster_sweep(paper.sweep(widths=(1024, 2048)), paper.HBM), Figure)


def test_state_reads_the_gradients_from_grad():
    import torch
    import torch.nn as nn

    from ddp_lab.course.ch14_planning import measure
    from ddp_lab.course.ch14_planning.plans import Built
    model = nn.Linear(4, 4)
    built = Built(model, torch.optim.Adam(model.parameters()), lambda k: None)
    assert measure.state_bytes(built)["gradients"] == 0          # no backward yet: no .grad
    model(torch.randn(2, 4)).sum().backward()
    assert measure.state_bytes(built)["gradients"] == (16 + 4) * 4
    model.bias.grad = None                                       # a plan that kept only some
    assert measure.state_bytes(built)["gradients"] == 16 * 4


def test_pipeline_slot_on_the_line_between_one_and_every_stage_busy():
    compute = {"pipeline_slot": 1.0, "pipeline_slot_busy": 4.0, "adam": 0.0}
    assert [timemodel.slot_seconds(b, compute) for b in (1, 2, 3, 4)] == [1.0, 2.0, 3.0, 4.0]
    # GPipe, m = p = 4: busy 1, 2, 3, 4, 3, 2, 1
    assert timemodel.pipeline_seconds(SMALL, compute) == pytest.approx(16.0)


def test_paper_zero2_shards_the_gradients_at_ddps_bytes():
    job = paper.Job(width=4096)
    plans = {n: paper.plan_at_scale(job, n) for n in ("DDP", "ZeRO-1", "ZeRO-2", "FSDP")}
    assert plans["ZeRO-2"]["comm"] == plans["DDP"]["comm"] == plans["ZeRO-1"]["comm"]
    state = {n: paper._plan(job, n)["state"] for n in plans}
    assert state["ZeRO-2"] == pytest.approx((2 + 14 / 64) * job.params)
    assert state["FSDP"] < state["ZeRO-2"] < state["ZeRO-1"] < state["DDP"]


def test_activations_one_tile_per_layer_and_per_pair_checkpointed(loopback):
    tile = SMALL.global_batch // 4 * SMALL.width * 4
    assert loopback["activations"] == [{"plain": SMALL.layers * tile,
                                        "checkpointed": SMALL.layers // 2 * tile}] * 4
