"""Notebook 08b: the NCCL table's defaults are checked where this torch holds them, torchrun
really sets TORCH_NCCL_ASYNC_ERROR_HANDLING for its workers, and torch's CommDebugMode
counts the same collectives as the course's CollectiveTrace."""

from __future__ import annotations

import os

import ddp_lab
from ddp_lab.course.ch08_when_it_breaks import comm_counts, nccl_env


def test_defaults_read_from_this_torch_are_there():
    assert nccl_env.unproven_defaults() == []
    checked = [v for v in nccl_env.ENV_VARS if v.default_from in nccl_env.FILES]
    assert checked and all(v.evidence for v in checked)
    old_path = nccl_env.EnvVar("X", "", nccl_env.LIBRARY, "", nccl_env.LIBRARY,
                               ("/tmp/nccl_trace_rank_",))  # an older default
    assert nccl_env.unproven_defaults((old_path,)) == ["X"]
    wrong = nccl_env.EnvVar("Y", "", "FlightRecorder.hpp", "", "FlightRecorder.hpp",
                            ('{"TORCH_FR_BUFFER_SIZE", "TORCH_NCCL_TRACE_BUFFER_SIZE"}, 0)',))
    assert nccl_env.unproven_defaults((wrong,)) == ["Y"]


def test_every_row_has_a_default_and_its_source():
    assert all(v.default and v.default_from for v in nccl_env.ENV_VARS)
    rows = nccl_env.markdown().splitlines()[2:]
    assert len(rows) == len(nccl_env.ENV_VARS) and all(r.count(" | ") == 4 for r in rows)


def test_torchrun_sets_async_error_handling_for_its_workers():
    result = nccl_env.seen_by_torchrun_workers("TORCH_NCCL_ASYNC_ERROR_HANDLING")
    assert result.returncode == 0
    expected = os.environ.get("TORCH_NCCL_ASYNC_ERROR_HANDLING", "1")
    assert result.lines()[-1].strip() == expected


def test_comm_debug_mode_counts_what_collective_trace_counts():
    for counted in ddp_lab.run(comm_counts.counted_both_ways, world_size=2, echo=False).values:
        ours = {f"c10d.{name}": n for name, n in counted["CollectiveTrace"].items()}
        assert counted["CommDebugMode"] == ours == {
            "c10d.allreduce_": 1, "c10d.broadcast_": 1, "c10d._allgather_base_": 1}
        assert counted["CommDebugMode total"] == 3
