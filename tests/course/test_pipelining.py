"""Notebook 11b's demos: every schedule of torch.distributed.pipelining it runs (GPipe, 1F1B,
interleaved 1F1B, ZBV) against one process and against notebook 11's from-scratch pipeline
on 2 and 3 ranks; the replay of the recorded orders against the bubble formulas; the
split backward; the figures."""

from __future__ import annotations

import pytest
import torch
from matplotlib.figure import Figure

import ddp_lab
from ddp_lab.course.ch11_meshes import pipe_model, pipelining, pipelining_plots, replay
from ddp_lab.course.ch11_meshes.pipeline import bubble
from ddp_lab.scratch.pipeline import gpipe_schedule, one_f_one_b_schedule

pytestmark = pytest.mark.timeout(240)

# No pacing: the orders, gradients and replays do not depend on how long a step takes.
FAST = pipe_model.PipeliningConfig(microbatches=6, microbatch_rows=4,
                                   pace=pipe_model.Pace(0.0, 0.0, 0.0))


def both(config):
    return {"library": pipelining.all_schedules(config), "scratch": pipe_model.scratch_steps(config)}


def layer_grads(library: list[dict], name: str) -> list:
    found = {i: g for r in library for i, g in r[name]["grads"].items()}
    return [layer for i in sorted(found) for layer in found[i]]


@pytest.fixture(scope="module", params=[2, 3], ids=["2 ranks", "3 ranks"])
def runs(request):
    values = ddp_lab.run(both, world_size=request.param, args=(FAST,), echo=False,
                         timeout=180).values
    return [v["library"] for v in values], [v["scratch"] for v in values]


def test_every_schedule_gives_one_process_gradients_and_loss(runs):
    library, _ = runs
    ref = pipe_model.reference(FAST, len(library))
    for s in pipelining.SCHEDULES:
        torch.testing.assert_close(layer_grads(library, s.name), ref["grads"])
        losses = [loss for r in library for loss in r[s.name]["losses"]]
        assert sum(losses) / FAST.microbatches == pytest.approx(ref["loss"], abs=1e-6)
        for rank, r in enumerate(library):
            assert r[s.name]["stages"] == pipelining.stages_of(s, rank, len(library))


def test_the_scratch_pipeline_runs_the_library_orders_and_gradients(runs):
    library, scratch_runs = runs
    p, m = len(library), FAST.microbatches
    for rank, (mine, theirs) in enumerate(zip(scratch_runs, library)):
        for name, steps in (("GPipe", gpipe_schedule), ("1F1B", one_f_one_b_schedule)):
            expected = [f"{k}{i}" for k, i in steps(p, m, rank)]
            assert pipelining.order(mine[name]["spans"]) == expected
            assert pipelining.order(theirs[name]["spans"]) == expected
            torch.testing.assert_close(mine[name]["grads"], theirs[name]["grads"][rank])


def test_zero_bubble_splits_every_backward_and_the_others_do_not(runs):
    library, _ = runs
    for s in pipelining.SCHEDULES:
        kinds = {label[0] for r in library for label, _, _ in r[s.name]["spans"]}
        assert kinds == ({"F", "I", "W"} if s.name.startswith("ZBV") else {"F", "B"}), s.name


def test_replayed_orders_give_the_formulas(runs):
    library, _ = runs
    p, m = len(library), FAST.microbatches
    rows = {r["name"]: r for r in replay.bubble_rows(library, FAST)}
    assert rows["GPipe"]["formula"] == pytest.approx((p - 1) / (m + p - 1))
    assert rows["Interleaved 1F1B"]["formula"] == pytest.approx((p - 1) / (2 * m + p - 1))
    for name in ("GPipe", "1F1B", "Interleaved 1F1B"):
        assert rows[name]["replayed"] == pytest.approx(rows[name]["formula"], abs=1e-9)
    assert rows["ZBV zero bubble"]["replayed"] == pytest.approx((p - 1) / (6 * m + p - 1), abs=1e-9)
    assert all(0 <= r["measured"] < 1 for r in rows.values())
    assert isinstance(pipelining_plots.bubbles(list(rows.values())), Figure)
    panels = [{"title": s.name, "spans": [r[s.name]["spans"] for r in library],
               "stages": [r[s.name]["stage_of_span"] for r in library]} for s in pipelining.SCHEDULES]
    assert isinstance(pipelining_plots.timelines(panels), Figure)


def test_each_rank_sends_the_messages_its_stage_boundaries_need(runs):
    # counted by CollectiveTrace around the timed step(): 2m per boundary between ranks,
    # none across the V's turn; ZBV exactly 2x GPipe's, interleaving (2p-1)/(p-1) times
    library, _ = runs
    p, m = len(library), FAST.microbatches
    totals = {}
    for s in pipelining.SCHEDULES:
        for rank, r in enumerate(library):
            got, want = r[s.name]["p2p"], pipelining.p2p_expected(s, rank, p, m)
            assert got["sends"] == got["recvs"] == want and got["other"] == [], (s.name, rank, got)
            assert got["sent_bytes"] == want * FAST.microbatch_rows * FAST.width * 4
            assert rank not in got["peers"]
        totals[s.name] = sum(r[s.name]["p2p"]["sends"] for r in library)
    assert totals["GPipe"] == totals["1F1B"] == 2 * m * (p - 1)
    assert totals["Interleaved 1F1B"] == 2 * m * (2 * p - 1)
    assert totals["ZBV zero bubble"] == 2 * totals["GPipe"]


@pytest.mark.parametrize("p", [2, 3, 4, 8])
def test_p2p_expected_counts_boundaries_between_ranks(p):
    m = 5
    total = {s.name: sum(pipelining.p2p_expected(s, r, p, m) for r in range(p))
             for s in pipelining.SCHEDULES}
    assert total == {"GPipe": 2 * m * (p - 1), "1F1B": 2 * m * (p - 1),
                     "Interleaved 1F1B": 2 * m * (2 * p - 1), "ZBV zero bubble": 4 * m * (p - 1)}
    zbv = pipelining.SCHEDULES[3]
    assert pipelining.p2p_expected(zbv, p - 1, p, m) == 2 * m     # the V's turn is local


def test_replay_by_hand():
    """Two stages, two micro-batches, GPipe: F costs 1, B 2; stage 1 waits 1 for F0 and stage
    0 waits for B1's gradient: bubble (p-1)/(m+p-1) = 1/3."""
    r0 = {"spans": [("F0", 0, 1), ("F1", 1, 2), ("B0", 5, 6), ("B1", 6, 7)], "stage_of_span": [0] * 4}
    r1 = {"spans": [("F0", 1, 2), ("F1", 2, 3), ("B0", 3, 4), ("B1", 4, 5)], "stage_of_span": [1] * 4}
    spans = replay.replay([r0, r1], virtual=1)
    assert spans[1] == [("F0", 1, 2), ("F1", 2, 3), ("B0", 3, 5), ("B1", 5, 7)]
    assert spans[0] == [("F0", 0, 1), ("F1", 1, 2), ("B0", 5, 7), ("B1", 7, 9)]
    assert bubble(spans) == pytest.approx(1 / 3)
    stuck = {"spans": [("B0", 0, 1)], "stage_of_span": [0]}  # a gradient that never comes
    with pytest.raises(RuntimeError, match="wait on each other"):
        replay.replay([stuck, {"spans": [("F0", 0, 1)], "stage_of_span": [1]}], virtual=1)


def test_split_backward_is_the_full_backward_in_two_halves():
    split = pipelining.split_backward(pipe_model.PipeliningConfig(pace=pipe_model.Pace(0.0, 0.0, 0.0)))
    assert all(g is None for g in split["weights_after_input"])
    torch.testing.assert_close(split["x_grad_split"], split["x_grad_full"])
    torch.testing.assert_close(split["weight_grads_split"], split["weight_grads_full"])


def test_paced_layers_equal_plain_linear_layers():
    torch.manual_seed(0)
    plain = torch.nn.Linear(8, 8)
    paced = pipe_model.PacedLinear(8, pipe_model.Pace(0.0, 0.0, 0.0))
    paced.load_state_dict(plain.state_dict())
    x = torch.randn(3, 8)
    torch.testing.assert_close(paced(x), plain(x))


def _others(config):
    import torch.distributed.pipelining as pp
    schedules = [pipelining.Schedule("interleaved zero bubble", pp.ScheduleInterleavedZeroBubble, virtual=2),
                 pipelining.Schedule("DualPipeV", pp.ScheduleDualPipeV, virtual=2, v_shape=True),
                 pipelining.Schedule("looped BFS", pp.ScheduleLoopedBFS, virtual=2)]
    return {s.name: pipelining.run_schedule(s, config) for s in schedules}


def test_the_other_schedules_the_notebook_names_run_timed_and_equal_one_process():
    """Notebook 11b says Schedule(name, cls, virtual=2, v_shape=...) describes torch's other
    multi-stage schedules to run_schedule: they run with TimedStage and give one process's
    gradients too."""
    config = pipe_model.PipeliningConfig(pace=pipe_model.Pace(0.0, 0.0, 0.0))
    library = ddp_lab.run(_others, world_size=4, args=(config,), echo=False, timeout=180).values
    ref = pipe_model.reference(config, 4)
    for name in library[0]:
        torch.testing.assert_close(layer_grads(library, name), ref["grads"])
