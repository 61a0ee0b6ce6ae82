"""The generic hang advice of WorkerTimeout tells what bounds a hang: the process group's
timeout, which ddp_lab sets to the run's timeout + 60 s (review part 4, A3-T1-02: it said
"waits forever")."""

from __future__ import annotations

import pytest

import ddp_lab
from ddp_lab.course.ch00_launching.live_ranks import group_timeout_s
from ddp_lab.launch.errors import WorkerTimeout

pytestmark = pytest.mark.timeout(120)


def test_the_hang_advice_names_the_group_timeout_not_forever():
    text = str(WorkerTimeout(5, [0], {0: "  File \"x.py\", line 1, in all_reduce"}, ["", ""]))
    assert "forever" not in text
    assert "until the process group's timeout" in text and "timeout + 60 s" in text


def test_the_group_timeout_is_the_run_timeout_plus_60_s_as_the_advice_says():
    assert ddp_lab.run(group_timeout_s, world_size=2, timeout=7, echo=False).values == [67.0] * 2
