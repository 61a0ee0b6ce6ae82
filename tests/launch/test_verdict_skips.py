"""A GPU-count guard that exits 0 on every rank is a warning, not a silent success."""

from __future__ import annotations

import sys
import warnings

import pytest

import ddp_lab
from ddp_lab.launch.verdict.outcome import RunResult
from ddp_lab.launch.verdict.skips import SkippedRunWarning, skip_line, warn_if_skipped

pytestmark = pytest.mark.timeout(120)

GUARD_LINE = "Unable to locate sufficient 2 gpus to run this example. Exiting."


def _result(values, logs):
    return RunResult(values=values, logs=logs, seconds=0.1)


@pytest.mark.parametrize("values, logs, warns", [
    ([None, None], [GUARD_LINE + "\n", GUARD_LINE + "\n"], True),
    ([None, None], ["Requires at least 2 GPUs; skipping\n", ""], True),
    ([None, None], ["training done\n", "training done\n"], False),  # plain None returns
    ([None, 1.0], [GUARD_LINE, GUARD_LINE], False),                # a rank really ran
    ([None, None], ["using 0 GPUs, falling back to the CPU\n", ""], False),  # no leaving
    ([None, None], ["exit code of the data loader: 0\n", ""], False),        # no device
])
def test_the_warning_needs_none_everywhere_and_a_skip_line(values, logs, warns):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        warn_if_skipped(_result(values, logs))
    assert [w.category for w in caught] == ([SkippedRunWarning] if warns else [])


def _example_guard(rank, world_size):
    """pytorch/examples' guard, as its ranks would meet it on a CPU-only machine."""
    import torch
    if not (torch.accelerator.is_available() and torch.accelerator.device_count() >= 2):
        print("Unable to locate sufficient 2 gpus to run this example. Exiting.")
        sys.exit()


def test_spawn_warns_when_every_rank_skipped_itself():
    with pytest.warns(SkippedRunWarning, match="skipped itself"):
        res = ddp_lab.spawn(_example_guard, args=(2,), nprocs=2)
    assert res.values == [None, None]
    assert skip_line(res.logs) == (0, GUARD_LINE)
