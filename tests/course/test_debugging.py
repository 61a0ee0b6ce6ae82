"""Notebook 08b's tools on real ranks: a profiler trace of DDP steps, the Flight Recorder
on gloo with torch's own analyzer, the NCCL variable table against torch's headers, and the
DETAIL segfault of notebook 08 reproduced under plain torchrun."""

from __future__ import annotations

import json

import pytest
from matplotlib.figure import Figure

import ddp_lab
from ddp_lab.course import trace_events
from ddp_lab.course.ch08_when_it_breaks import flight_recorder, mismatches, nccl_env, profiling
from ddp_lab.course.ch08_when_it_breaks.plots import profile_timeline

pytestmark = pytest.mark.timeout(240)


# -- no processes ------------------------------------------------------------------------
def test_most_in_flight_counts_overlaps():
    assert trace_events.most_in_flight([]) == 0
    assert trace_events.most_in_flight([(0, 1), (1, 2)]) == 1      # touching is not overlapping
    assert trace_events.most_in_flight([(0, 3), (1, 2), (1.5, 4), (5, 6)]) == 3


def test_chrome_trace_times_are_epoch_seconds(tmp_path):
    trace = {"baseTimeNanoseconds": 1_700_000_000_000_000_000,
             "traceEvents": [{"ph": "X", "name": "gloo:all_reduce", "cat": "user_annotation",
                              "tid": 7, "ts": 2_000_000.0, "dur": 500_000.0},
                             {"ph": "i", "name": "instant", "ts": 1.0}]}
    path = tmp_path / "t.json"
    path.write_text(json.dumps(trace))
    [span] = trace_events.read_chrome_trace(str(path))
    assert span.name == "gloo:all_reduce" and span.thread == "7"
    assert span.start == pytest.approx(1_700_000_002.0)
    assert span.end == pytest.approx(1_700_000_002.5)
    assert trace_events.collective_spans([span], within=(0, 1)) == []


def test_every_torch_variable_of_the_table_is_declared_in_this_torch():
    assert nccl_env.missing_from_headers() == []
    fake = (nccl_env.EnvVar("TORCH_NCCL_NO_SUCH_THING", "", "ProcessGroupNCCL.hpp"),)
    assert nccl_env.missing_from_headers(fake) == ["TORCH_NCCL_NO_SUCH_THING"]
    assert nccl_env.markdown().count("\n") == len(nccl_env.ENV_VARS) + 1


# -- real ranks --------------------------------------------------------------------------
def test_profiler_trace_shows_buckets_on_gloo_threads(tmp_path):
    paths = ddp_lab.run(profiling.profile_ddp_steps, world_size=2, args=(str(tmp_path),),
                        echo=False).values
    profiles = [profiling.read_profile(p) for p in paths]
    for prof in profiles:
        assert [s.name for s in prof.steps] == ["ProfilerStep#1", "ProfilerStep#2"]
        assert [c.name for c in prof.collectives].count("gloo:all_reduce") == 8
        assert 1 <= len(prof.threads()) <= 2 and 0 <= prof.hidden_fraction <= 1
    assert isinstance(profile_timeline(profiles), Figure)


def test_flight_recorder_analyzer_names_the_rank_that_did_not_join(tmp_path):
    results = ddp_lab.run(flight_recorder.skip_one_collective, world_size=2,
                          args=(str(tmp_path),), echo=False, timeout=60).values
    assert [len(r["entries"]) for r in results] == [4, 3]
    analysis = flight_recorder.analyze(str(tmp_path))
    assert analysis.returncode == 0
    assert "Not all ranks joining collective, sequence number: 4" in analysis.stdout
    assert "missing ranks: {1}" in analysis.stdout


def _two_groups(folder):
    import torch
    import torch.distributed as dist
    group = dist.new_group(group_desc="training")
    t = torch.ones(10)
    dist.all_reduce(t)                 # on WORLD
    dist.all_reduce(t, group=group)    # on the subgroup
    trace = flight_recorder.dump(folder, group)
    return sorted({e["process_group"][0] for e in trace["entries"]}), sorted(trace["pg_config"])


def test_flight_recorder_dump_has_a_row_for_every_group_the_entries_name(tmp_path):
    """IP-08b-3: with collectives on WORLD and on a subgroup, a table of the passed group
    alone made torch's analyzer fail with a KeyError."""
    results = ddp_lab.run(_two_groups, world_size=2, args=(str(tmp_path),), echo=False,
                          timeout=60).values
    for groups, rows in results:
        assert len(groups) == 2 and set(groups) <= set(rows)
    analysis = flight_recorder.analyze(str(tmp_path))
    assert analysis.returncode == 0, analysis.stdout[-2000:]


def test_ddp_segfaults_under_detail_with_plain_torchrun_and_runs_under_info():
    """What notebook 08 says: under DETAIL the constructor crashes; under INFO DDP is built,
    runs a backward and the script exits cleanly (it imports torch.distributed.nn first: see
    test_worker_scripts_leave_no_gloo_thread_to_the_interpreters_exit)."""
    detail = mismatches.ddp_under_torchrun("DETAIL", nproc=1)  # two: a crash may kill the peer
    assert detail.returncode != 0 and "SIGSEGV" in detail.output
    info = mismatches.ddp_under_torchrun("INFO", nproc=2)
    assert info.returncode == 0 and info.output.count("DDP built") == 2, info.output
