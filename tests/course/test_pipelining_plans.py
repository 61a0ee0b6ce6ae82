"""Notebook 11b's claims about torch's plans, without processes: ZBV's (p-1)/(6m+p-1) holds
for every m >= 2p - 1 and fails at m = p (review R3-11b-I1; between the two it depends on
p), and the in-flight count follows F and B, or W with a split backward."""

from __future__ import annotations

import pytest

from ddp_lab.course.ch11_meshes import pipelining, replay
from ddp_lab.course.ch11_meshes.pipeline import bubble


@pytest.mark.parametrize("p", [2, 3, 4, 8])
@pytest.mark.parametrize("m", [2, 3, 4, 5, 7, 8, 15, 16])
def test_zbv_formula_holds_from_m_2p_minus_1_and_fails_at_m_p(p, m):
    got = bubble(replay.replay(replay.torch_zbv_orders(p, m), 2))
    if m >= 2 * p - 1:
        assert got == pytest.approx(replay.zbv_formula(p, m), abs=1e-9)
    if m == p:
        assert got > replay.zbv_formula(p, m) + 0.01


def test_peak_in_flight_counts_forwards_not_yet_backwarded():
    # A split backward holds a micro-batch's activations from F until W (I keeps the graph
    # for W, retain_graph=True): F0 F1 I0 F2 hold three.
    spans = [(label, i, i + 1) for i, label in enumerate(["F0", "F1", "I0", "F2", "W0", "B1", "I2", "W2"])]
    assert pipelining.peak_in_flight({"spans": spans}) == 3


@pytest.mark.parametrize("p, m", [(2, 4), (4, 8), (4, 16), (8, 16)])
def test_zbv_holds_2p_half_stages_until_w_on_every_rank(p, m):
    # torch's own ZBV plans, counted from F to W (in-project review IP-11b-2): still 2p on
    # every rank, 1F1B's rank-0 peak in half stages, as notebook 11b asserts from its run.
    assert [pipelining.peak_in_flight(r) for r in replay.torch_zbv_orders(p, m)] == [2 * p] * p
