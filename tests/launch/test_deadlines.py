"""The one deadline policy (deadlines.Deadline), called directly: when a run, a live call,
a torchrun run or a runner of agents must stop, and why."""

from __future__ import annotations

import math

from ddp_lab.launch.deadlines import (BOUND_SLACK_S, FAILURE_GRACE_S, GRACE_OVER, START_SLACK_S,
                                      TIMED_OUT, WORST_CASE_WAITS_S, Deadline, StartClock)


def test_a_run_without_failure_ends_at_its_timeout():
    deadline = Deadline(started=100.0, timeout=5.0)
    assert deadline.ends_at() == 105.0
    assert deadline.due(104.9) is None
    assert deadline.due(105.0) == TIMED_OUT


def test_a_failure_leaves_its_peers_the_grace_then_stops_them():
    deadline = Deadline(started=100.0, timeout=60.0)
    assert deadline.ends_at(first_failure=110.0) == 110.0 + FAILURE_GRACE_S
    assert deadline.due(110.0 + FAILURE_GRACE_S - 0.1, first_failure=110.0) is None
    assert deadline.due(110.0 + FAILURE_GRACE_S, first_failure=110.0) == GRACE_OVER


def test_the_grace_never_runs_past_the_deadline_or_the_limit():
    deadline = Deadline(started=100.0, timeout=5.0, limit=103.0)
    assert deadline.ends_at() == 103.0
    assert deadline.ends_at(first_failure=102.5) == 103.0
    assert deadline.due(103.0, first_failure=102.5) == GRACE_OVER  # a failure explains it


def test_without_a_grace_failures_do_not_shorten_the_run():
    deadline = Deadline(started=0.0, timeout=30.0, grace=None)  # torchrun stops peers itself
    assert deadline.ends_at(first_failure=1.0) == 30.0
    assert Deadline(0.0, 30.0, grace=None).ends_at() == 30.0


def test_the_start_clock_bounds_set_up_and_the_run():
    clock = StartClock(entered=10.0, timeout=2.0)
    assert clock.limit == 12.0 + START_SLACK_S
    assert clock.setup_until == clock.limit  # a short run: its own bound first
    deadline = clock.deadline(started=11.0)
    assert deadline.ends_at() == 13.0 and deadline.limit == clock.limit
    slow = clock.deadline(started=clock.limit - 0.5)  # a slow start eats into the slack
    assert slow.ends_at() == clock.limit
    assert math.isinf(Deadline(0.0, 1.0).limit)


def test_the_worst_chain_of_waits_fits_the_slack():
    assert WORST_CASE_WAITS_S <= BOUND_SLACK_S - 3.0
