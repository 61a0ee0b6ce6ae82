"""Failure records, typed and plain on disk (issue 44): a rank's (rank/failure.py) and what
torchrun's agent reports (torchrun/failures.py). No processes: the records are written and
read as the rank, the agent and the kernel do."""

from __future__ import annotations

import json
import pickle
from types import SimpleNamespace

import pytest

import ddp_lab
from ddp_lab.launch.rank.failure import (UNREADABLE, RankFailure, failure_of, read_failure,
                                         write_failure)
from ddp_lab.launch.torchrun.failures import (AgentFailure, read_agent_failures,
                                              write_agent_failures)


def _raised(exc: BaseException) -> BaseException:
    try:
        raise exc
    except BaseException as caught:  # noqa: BLE001
        return caught


def test_a_rank_failure_goes_to_disk_as_json_and_comes_back_equal(tmp_path):
    failure = failure_of(_raised(ValueError("bad batch on rank 2")), 12.5)
    assert (failure.type_name, failure.message, failure.time) == \
        ("ValueError", "bad batch on rank 2", 12.5)
    assert failure.traceback.startswith("Traceback (most recent call last):")
    assert failure.headline == failure.one_line == "ValueError: bad batch on rank 2"
    write_failure(tmp_path / "rank2.error", failure)
    on_disk = json.loads((tmp_path / "rank2.error").read_text())
    assert on_disk == {"type": "ValueError", "message": "bad batch on rank 2",
                       "traceback": failure.traceback, "time": 12.5}
    assert read_failure(tmp_path / "rank2.error") == failure
    assert not list(tmp_path.glob("*.tmp"))
    assert read_failure(tmp_path / "rank3.error") is None


def test_a_message_with_lone_surrogates_survives_the_round_trip(tmp_path):
    failure = RankFailure("UnicodeError", "bad byte \udcff here", "tb", 1.0)
    write_failure(tmp_path / "e", failure)
    assert read_failure(tmp_path / "e") == failure


@pytest.mark.parametrize("plain, says", [
    ({"type": "ValueError", "message": "bad", "traceback": None}, "traceback missing"),
    ({"message": "bad", "traceback": "", "time": 1.0}, "type missing"),
    ({"type": "E", "message": 3, "traceback": "", "time": 1.0}, "message missing"),
    ({"type": "E", "message": "m", "traceback": "", "time": "soon"}, "time missing"),
    ([1, 2], "a list instead of a record"),
    (None, "a NoneType instead of a record")])
def test_a_malformed_record_is_read_as_an_unreadable_one(plain, says):
    failure = RankFailure.from_plain(plain)
    assert failure.type_name == UNREADABLE and failure.time is None
    assert says in failure.message and "could not be read" in failure.message
    assert failure.traceback.endswith(failure.message)


def test_a_record_without_traceback_or_time_is_read_with_neither():
    assert RankFailure.from_plain({"type": "ValueError", "message": "bad"}) == \
        RankFailure("ValueError", "bad", "", None)


def test_a_truncated_file_is_an_unreadable_record(tmp_path):
    (tmp_path / "e").write_text('{"type": "ValueError", "mess')
    failure = read_failure(tmp_path / "e")
    assert failure.type_name == UNREADABLE and "not JSON" in failure.message


class _Planted:
    """What a rank's code could leave in a pickle: a class whose loading runs code."""

    def __reduce__(self):
        return (open, ("/tmp/ddp_lab_failure_record_planted", "w"))


def test_a_pickle_in_the_error_file_is_never_unpickled(tmp_path):
    import os
    planted = "/tmp/ddp_lab_failure_record_planted"
    if os.path.exists(planted):
        os.unlink(planted)
    (tmp_path / "e").write_bytes(pickle.dumps({"type": "X", "message": _Planted()}))
    failure = read_failure(tmp_path / "e")
    assert failure.type_name == UNREADABLE and not os.path.exists(planted)


def test_a_crash_whose_record_is_unreadable_still_names_its_rank(tmp_path):
    from ddp_lab.launch.config import LaunchConfig, RunFiles
    from ddp_lab.launch.verdict.outcome import conclude
    from ddp_lab.launch.verdict.record import RankRecord, RunRecord
    files = RunFiles(tmp_path)
    files.error(1).write_text("not a record")
    config = LaunchConfig(world_size=2, backend="gloo", timeout=5.0, env={})
    ranks = (RankRecord(0, -15, 2.0, True, ""), RankRecord(1, 1, 1.0, False, "boom"))
    with pytest.raises(ddp_lab.WorkerError) as caught:
        conclude(RunRecord(config, ranks, files, 0.5))
    err = caught.value
    assert err.rank == 1 and "could not be read" in str(err) and "err.logs" in str(err)
    assert list(err.knock_on) == [0]


def test_torchrun_failures_round_trip_through_the_agent_report(tmp_path):
    from torch.distributed.elastic.multiprocessing.errors import ProcessFailure
    torch_failure = ProcessFailure(local_rank=1, pid=4242, exitcode=-6,
                                   error_file=str(tmp_path / "missing.json"))
    report = tmp_path / "torchrun_failures.json"
    write_agent_failures(report, {3: AgentFailure.of(torch_failure)})
    read = read_agent_failures(report)
    assert read == {3: AgentFailure(-6, 1, 4242, torch_failure.message, "<N/A>")}
    assert "Signal 6 (SIGABRT)" in read[3].message
    assert read_agent_failures(tmp_path / "none.json") == {}


def test_the_agent_report_as_agent_py_writes_it_today_is_read(tmp_path):
    report = tmp_path / "torchrun_failures.json"
    report.write_text(json.dumps({"0": {"exitcode": 1, "local_rank": 0, "pid": 7,
                                        "message": {"message": "RuntimeError: x"},
                                        "error_file": "/tmp/e.json"}}))
    (failure,) = read_agent_failures(report).values()
    assert failure.exitcode == 1 and failure.pid == 7 and "RuntimeError: x" in failure.message


@pytest.mark.parametrize("text", ['{"0": {"pid": 7}}', '{"0": {"exitcode": true}}',
                                  '[1]', '{"zero": {"exitcode": 1}}', '{"0": '])
def test_an_unreadable_agent_report_says_so_naming_its_file(tmp_path, text):
    report = tmp_path / "torchrun_failures.json"
    report.write_text(text)
    with pytest.raises(ddp_lab.DistributedRunError, match="torchrun_failures.json"):
        read_agent_failures(report)


def test_agent_failure_of_takes_torchs_fields():
    failure = AgentFailure.of(SimpleNamespace(exitcode=2, local_rank=0, pid=9, message="m",
                                              error_file="f"))
    assert failure == AgentFailure(2, 0, 9, "m", "f")


def test_a_record_held_in_memory_is_judged_without_a_run_folder():
    """A live call's record (live/outcome.py): no folder, the failures and the ranks that
    returned held in memory, judged as a one-shot run's."""
    from ddp_lab.launch.config import LaunchConfig
    from ddp_lab.launch.verdict.outcome import conclude
    from ddp_lab.launch.verdict.record import RankRecord, RunRecord
    config = LaunchConfig(world_size=3, backend="gloo", timeout=5.0, env={})
    bad = RankFailure("ValueError", "bad batch", "Traceback ...\nValueError: bad batch", 1.5)
    ranks = (RankRecord(0, 0, 2.0, False, ""), RankRecord(1, 1, 1.5, False, ""),
             RankRecord(2, 0, 1.0, False, ""))
    with pytest.raises(ddp_lab.WorkerError) as caught:
        conclude(RunRecord(config, ranks, None, 0.5, failures={1: bad},
                           returned=frozenset({0, 2})))
    err = caught.value
    assert err.rank == 1 and "ValueError: bad batch" in err.traceback
    assert err.values == [None, None, None] and "ValueError: bad batch" in err.logs[1]
    closed = RankFailure("RuntimeError", "Connection closed by peer", "tb", 1.5)
    with pytest.raises(ddp_lab.WorkerError) as caught:  # rank 2 left (os._exit(0)) early
        conclude(RunRecord(config, ranks, None, 0.5, failures={1: closed},
                           returned=frozenset({0})))
    assert caught.value.rank == 2 and "left the run early" in str(caught.value)
