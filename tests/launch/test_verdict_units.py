"""The verdict's pure functions, no processes: stacks, root causes, error records."""

from __future__ import annotations

import pytest

from ddp_lab.launch.errors import (DistributedRunError, UnreadableResult, WorkerError,
                                   describe_ranks, short_message)
from ddp_lab.launch.rank.failure import RankFailure
from ddp_lab.launch.verdict.signs import looks_like_knock_on
from ddp_lab.launch.verdict.stacks import format_dump, waiting_in

DUMP = '''Thread 0x00007f0000000001 (most recent call first):
  File "/x/ddp_lab/launch/rank/main.py", line 90 in watch
  File "/usr/lib/python3.11/threading.py", line 982 in run

Current thread 0x00007f0000000002 (most recent call first):
  File "/site/torch/distributed/distributed_c10d.py", line 3252 in all_reduce
  File "/site/torch/distributed/c10d_logger.py", line 83 in wrapper
  File "/tmp/ipykernel_1/123.py", line 7 in uneven_work
  File "/x/ddp_lab/launch/rank/main.py", line 130 in _call_function
  File "/x/ddp_lab/launch/forkserver/server.py", line 90 in _become_rank
  File "<frozen runpy>", line 88 in _run_code
'''


def test_stack_dump_is_oldest_first_without_launcher_frames():
    text = format_dump(DUMP)
    lines = [l for l in text.splitlines() if l.strip().startswith("File")]
    assert [l.split(" in ")[-1] for l in lines] == ["uneven_work", "wrapper", "all_reduce"]
    assert "watch" not in text and "forkserver/server" not in text
    assert waiting_in(text) == "all_reduce"


def test_stack_dump_quotes_source_from_linecache(tmp_path):
    import linecache
    linecache.cache["<cell 9>"] = (20, None, ["x = 1\n", "dist.barrier()\n"], "<cell 9>")
    dump = 'Current thread 0x1 (most recent call first):\n  File "<cell 9>", line 2 in f\n'
    assert "    dist.barrier()" in format_dump(dump)


@pytest.mark.parametrize("ranks, text", [([3], "rank 3"), ([0, 1, 2, 3], "ranks 0-3"),
                                         ([0, 2], "ranks 0, 2")])
def test_describe_ranks(ranks, text):
    assert describe_ranks(ranks) == text


def test_gloo_prefix_is_dropped_and_long_messages_cut_at_a_word():
    msg = "[/__w/pytorch/gloo/pair.cc:553] Connection closed by peer [127.0.0.1]:1. " + "x " * 100
    short = short_message(msg)
    assert short.startswith("Connection closed by peer") and short.endswith(" ...")
    assert len(short) <= 124


def test_knock_on_errors_are_recognised():
    assert looks_like_knock_on(RankFailure("RuntimeError", "Connection reset by peer"))
    assert not looks_like_knock_on(RankFailure("ValueError", "bad batch"))
    assert not looks_like_knock_on(None)


def test_a_finished_run_is_concluded_from_its_record_alone(tmp_path):
    import ddp_lab
    from ddp_lab.launch.config import LaunchConfig, RunFiles, write_pickle
    from ddp_lab.launch.rank.failure import write_failure
    from ddp_lab.launch.verdict.outcome import conclude
    from ddp_lab.launch.verdict.record import RankRecord, RunRecord
    files = RunFiles(tmp_path)
    config = LaunchConfig(world_size=2, backend="gloo", timeout=5.0, env={})
    for rank in range(2):
        write_pickle(files.result(rank), rank * 10)
    ok = [RankRecord(r, 0, 1.0, False, f"hi from {r}") for r in range(2)]
    result = conclude(RunRecord(config, tuple(ok), files, 0.5))
    assert result.values == [0, 10] and result.logs == ["hi from 0", "hi from 1"]
    assert files.results() == {0: 0, 1: 10}
    write_failure(files.error(1), RankFailure("ValueError", "bad",
                                              "Traceback ...\nValueError: bad", 1.0))
    crashed = (ok[0], RankRecord(1, 1, 1.0, False, "ValueError: bad"))
    with pytest.raises(ddp_lab.WorkerError) as caught:
        conclude(RunRecord(config, crashed, files, 0.5))
    assert caught.value.rank == 1 and "ValueError: bad" in caught.value.traceback
    with pytest.raises(ddp_lab.WorkerTimeout) as caught:
        conclude(RunRecord(config, tuple(ok), files, 5.0, timed_out=True, stacks={1: "Stack"}))
    assert caught.value.stuck_ranks == [1]


def _record(tmp_path, exits: dict, results=(), errors=None, script=None):
    """A finished run as the session would record it: rank -> exit code, which ranks left a
    result, and error records (rank -> message) written by failed ranks."""
    from ddp_lab.launch.config import LaunchConfig, RunFiles, write_pickle
    from ddp_lab.launch.rank.failure import write_failure
    from ddp_lab.launch.verdict.record import RankRecord, RunRecord
    files = RunFiles(tmp_path)
    for rank in results:
        write_pickle(files.result(rank), rank)
    for rank, message in (errors or {}).items():
        write_failure(files.error(rank), RankFailure("RuntimeError", message, message,
                                                     2.0 + rank))
    config = LaunchConfig(world_size=len(exits), backend="gloo", timeout=5.0, env={},
                          script=script)
    ranks = tuple(RankRecord(r, code, 1.0 + r, False, "") for r, code in exits.items())
    return RunRecord(config, ranks, files, 0.5)


CLOSED = "[../gloo/transport/tcp/pair.cc:534] Connection closed by peer [127.0.0.1]:4242"


def test_a_rank_that_left_fn_with_os_exit_is_the_root_cause(tmp_path):
    from ddp_lab.launch.verdict.outcome import conclude
    run = _record(tmp_path, {0: 1, 1: 1, 2: 0}, results=(), errors={0: CLOSED, 1: CLOSED})
    with pytest.raises(WorkerError) as caught:
        conclude(run)
    err = caught.value
    assert (err.rank, err.exitcode) == (2, 0) and sorted(err.knock_on) == [0, 1]
    text = str(err)
    assert text.startswith("rank 2 left the run early (exit code 0")
    assert "Rank 2 ended before fn returned" in text and "os._exit()" in text


def test_a_rank_that_returned_while_peers_waited_is_the_root_cause(tmp_path):
    from ddp_lab.launch.verdict.outcome import conclude
    run = _record(tmp_path, {0: 0, 1: 1, 2: 1}, results=(0,), errors={1: CLOSED, 2: CLOSED})
    with pytest.raises(WorkerError) as caught:
        conclude(run)
    assert caught.value.rank == 0 and sorted(caught.value.knock_on) == [1, 2]
    assert "Rank 0 returned while the others still waited" in str(caught.value)


def test_an_error_of_its_own_stays_the_root_cause_when_a_peer_returned(tmp_path):
    from ddp_lab.launch.verdict.outcome import conclude
    run = _record(tmp_path, {0: 0, 1: 1, 2: 1}, results=(0,),
                  errors={1: CLOSED, 2: "bad batch"})
    with pytest.raises(WorkerError) as caught:
        conclude(run)
    assert caught.value.rank == 2 and "left the run early" not in str(caught.value)


def test_a_value_that_cannot_be_unpickled_names_its_rank_and_keeps_the_others(tmp_path):
    import sys
    import types

    from ddp_lab.launch.verdict.outcome import conclude
    run = _record(tmp_path, {0: 0, 1: 0, 2: 0}, results=(0, 2))
    rank_only = types.ModuleType("module_only_the_ranks_have")
    exec("class Thing:\n    pass\n", rank_only.__dict__)
    sys.modules[rank_only.__name__] = rank_only
    try:
        import pickle
        run.files.result(1).write_bytes(pickle.dumps(rank_only.Thing()))
    finally:
        del sys.modules[rank_only.__name__]
    with pytest.raises(UnreadableResult) as caught:
        conclude(run)
    err = caught.value
    assert isinstance(err, DistributedRunError)
    assert err.rank == 1 and err.values == [0, None, 2]
    assert "ModuleNotFoundError" in err.reasons[1] and "rank 1 finished" in str(err)
    assert "plain data" in str(err)


def test_an_exception_whose_str_raises_is_still_recorded(tmp_path):
    from ddp_lab.launch.rank.failure import read_failure
    from ddp_lab.launch.rank.main import write_error as _record_error

    class Unprintable(Exception):
        def __str__(self):
            raise AttributeError("no attribute 'detail'")

    try:
        raise Unprintable("disk 3")
    except Unprintable as exc:
        _record_error(tmp_path / "e.pkl", exc)
    record = read_failure(tmp_path / "e.pkl")
    assert record.type_name == "Unprintable"
    assert record.message.startswith("Unprintable('disk 3') (its message could not be")
    assert "AttributeError" in record.message
    assert record.traceback.rstrip().endswith(record.message)
