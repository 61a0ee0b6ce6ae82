"""A rank that prints without end costs the kernel a bounded amount of memory: its log keeps
the head and the tail with a count of what was dropped between them, a line without newline
is cut, and live ranks keep no history across calls."""

from __future__ import annotations

import pytest

import ddp_lab
import workers
from ddp_lab.launch.api import launch, pickle_payload
from ddp_lab.launch.config import LaunchConfig
from ddp_lab.launch.output.kept_log import LINE_COST
from ddp_lab.launch.output.reader import MAX_LINE_BYTES

pytestmark = pytest.mark.timeout(120)

LIMIT = 1 << 20
FLOOD = 300_000  # lines of 100 bytes: 30 MB
PER_PART = LIMIT // (99 + LINE_COST)  # lines the head keeps, and the tail


def _flood(fail: bool = False):
    config = LaunchConfig(world_size=2, backend="gloo", timeout=60.0, env={}, echo=False,
                          log_limit=LIMIT)
    return launch(config, pickle_payload(workers.flood, (FLOOD,), {"fail": fail}))


def _assert_head_marker_tail(log: str) -> None:
    lines = log.split("\n")
    assert len(log) < 2 * LIMIT  # what the kernel holds, not the 30 MB printed
    assert len(lines) == 2 * PER_PART + 1
    numbers = [int(line[:9]) for line in lines[:PER_PART] + lines[PER_PART + 1:]]
    assert numbers == [*range(PER_PART), *range(FLOOD - PER_PART, FLOOD)]
    dropped = FLOOD - 2 * PER_PART
    assert lines[PER_PART] == (
        f"... [ddp_lab: {dropped} lines ({dropped * 100 / 2**20:.1f} MB) dropped here; the "
        f"first {PER_PART * 100 / 2**20:.1f} MB and the last {PER_PART * 100 / 2**20:.1f} MB "
        "of this rank's output are kept] ...")


def test_a_flood_keeps_head_and_tail_and_counts_what_was_dropped():
    res = _flood()
    assert res.values == [FLOOD, 1]
    _assert_head_marker_tail(res.logs[0])
    assert res.logs[1] == "a quiet rank"


def test_the_error_after_a_flood_is_still_found():
    with pytest.raises(ddp_lab.WorkerError) as caught:
        _flood(fail=True)
    err = caught.value
    assert err.rank == 0 and "failed after the flood" in err.traceback
    assert "dropped here" in err.logs[0] and len(err.logs[0]) < 3 * LIMIT


def test_output_without_newline_is_cut_into_lines_at_the_limit():
    res = ddp_lab.run(workers.no_newline, world_size=1, args=(5 * MAX_LINE_BYTES,), echo=False)
    assert res.logs[0].split("\n") == ["a" * MAX_LINE_BYTES] * 5 + ["end"]


def test_live_ranks_keep_no_lines_of_earlier_calls():
    block = "print(('x' * 99 + '\\n') * 20_000, end='')\nprint('call', rank)"  # 2 MB a call
    with ddp_lab.Ranks(world_size=2, timeout=30, echo=False) as ranks:
        for _ in range(6):
            res = ranks.exec(block)
        kept = [state.lines.text() for state in ranks._session.ranks]
    assert all(log.endswith(f"\ncall {rank}") for rank, log in enumerate(res.logs))
    assert kept == res.logs and all(len(log) < 2_100_000 for log in kept)
