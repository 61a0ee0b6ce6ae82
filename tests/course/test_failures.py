"""Notebook 08's failures, provoked on real ranks (and real torchrun), and the fixes checked
against single-process references. The uneven-input hang (where each rank waits) and the
killed, restarted and resumed training (bit-identical to an uninterrupted run) are asserted
by notebook 08 itself, which the suite executes: they are not run a second time here."""

from __future__ import annotations

import json

import pytest
import torch
from conftest import wait_until_gone
from matplotlib.figure import Figure

import ddp_lab
from ddp_lab.course.ch08_when_it_breaks import crashes, mismatches, recovery, stragglers, uneven_inputs
from ddp_lab.launch.torchrun.command import TorchrunResult, torchrun
from ddp_lab.course.ch08_when_it_breaks.plots import recovery_losses, step_times

pytestmark = pytest.mark.timeout(180)


# -- no processes ------------------------------------------------------------------------
@pytest.mark.parametrize("world_size", [1, 2, 3, 4])
def test_shardings_cover_the_data_as_documented(world_size):
    size = uneven_inputs.DATASET_SIZE
    strided = [uneven_inputs.shard_indices("strided", r, world_size) for r in range(world_size)]
    assert sorted(i for shard in strided for i in shard) == list(range(size))
    padded = [uneven_inputs.shard_indices("padded", r, world_size) for r in range(world_size)]
    assert {len(s) for s in padded} == {-(-size // world_size)}
    assert set().union(*map(set, padded)) == set(range(size))
    dropped = [uneven_inputs.shard_indices("drop_last", r, world_size) for r in range(world_size)]
    assert {len(s) for s in dropped} == {size // world_size}


def test_only_the_hand_made_split_is_uneven():
    assert uneven_inputs.batches_per_rank("strided", 3) == [5, 4, 4]
    assert uneven_inputs.batches_per_rank("padded", 3) == [5, 5, 5]
    assert uneven_inputs.batches_per_rank("drop_last", 3) == [4, 4, 4]
    with pytest.raises(ValueError, match="must be one of"):
        uneven_inputs.shard_indices("sideways", 0, 2)


def test_step_times_summaries_leave_out_the_first_two_steps_and_the_optimizer():
    """IP-08-1: step 1's forward waits for the straggler in the bucket rebuild's broadcasts,
    so the means start at step 2; IP-08-2: optimizer.step() is not charged to backward."""
    times = stragglers.StepTimes.from_values([
        {"rank": 0, "slow": False, "step": [1.0, 0.3, 0.25, 0.45],
         "before_backward": [0.5, 0.2, 0.0, 0.0], "through_backward": [0.9, 0.25, 0.2, 0.4]},
        {"rank": 1, "slow": True, "step": [1.0, 0.3, 0.25, 0.45],
         "before_backward": [0.5, 0.2, 0.2, 0.4], "through_backward": [0.9, 0.25, 0.2, 0.4]},
    ], delay=0.2)
    assert times.slow_rank == 1
    assert times.mean_ms() == pytest.approx([350.0, 350.0])
    assert times.mean_ms("before_backward") == pytest.approx([0.0, 300.0])
    assert times.waiting_ms() == pytest.approx([300.0, 0.0])
    assert times.optimizer_ms() == pytest.approx([50.0, 50.0])
    with pytest.raises(ValueError, match="run more than 2 steps"):
        stragglers.StepTimes([[1.0, 0.2]], [[0.1, 0.1]], [[0.5, 0.1]], 0, 0.2).mean_ms()
    assert isinstance(step_times(times), Figure)


LOG = """I1121 api.py:553]   restart_count=0
Epoch [0/3] completed. Loss: 2.2633
rank 1: checkpoint written, now SIGKILL myself (pid 7)
I1121 api.py:553]   restart_count=1
Resumed from /tmp/c.pt after epoch 0.
Epoch [1/3] completed. Loss: 1.3079
Epoch [2/3] completed. Loss: 0.4337
"""


def test_torchrun_log_says_which_attempt_ran_which_epoch():
    attempts = recovery.epoch_losses_by_attempt(LOG)
    assert attempts == {0: {0: 2.2633}, 1: {1: 1.3079, 2: 0.4337}}
    assert isinstance(recovery_losses([2.2633, 1.3079, 0.4337], attempts), Figure)
    result = TorchrunResult(("python", "-m", "torch.distributed.run", "x.py"), 0, LOG, 1.0)
    assert result.shell_command == "torchrun x.py"
    assert result.section("restart_count=1", "Resumed").splitlines()[-1].startswith("Resumed")
    assert "Resumed from /tmp/c.pt after epoch 0." in recovery.story(result)


def test_a_killed_run_that_lost_torchruns_port_race_runs_again(tmp_path, monkeypatch, capsys):
    lost = "[rank0]: torch.distributed.DistNetworkError: ... name: EADDRINUSE, message: ..."
    outputs, checkpoint = [lost, LOG], tmp_path / "killed.pt"

    def torchrun_once(argv, nproc, **kwargs):  # only the output matters to the retry
        assert not checkpoint.exists(), "each run starts without the last one's checkpoint"
        checkpoint.write_bytes(b"written by this run")
        return TorchrunResult(("python", "-m", "torch.distributed.run"), 0, outputs.pop(0), 1.0)

    monkeypatch.setattr(recovery, "torchrun", torchrun_once)
    assert recovery.killed_once_under_torchrun(checkpoint).output == LOG
    assert "EADDRINUSE" in capsys.readouterr().err and outputs == []
    monkeypatch.setattr(recovery, "torchrun", lambda *a, **k: TorchrunResult((), 1, lost, 1.0))
    assert recovery.killed_once_under_torchrun(checkpoint, tries=2).returncode == 1


def test_error_files_are_read_by_attempt_and_local_rank(tmp_path):
    record = {"message": {"message": "ValueError: bad batch",
                          "extraInfo": {"py_callstack": "Traceback\n  ...\nValueError: bad batch",
                                        "timestamp": "1700000000"}}}
    folder = tmp_path / "run_abc" / "attempt_1" / "0"
    folder.mkdir(parents=True)
    (folder / "error.json").write_text(json.dumps(record))
    found = crashes.read_error_files(tmp_path)
    assert list(found) == [(1, 0)]
    summary = crashes.error_file_summary(found[1, 0])
    assert summary["message"] == "ValueError: bad batch"
    assert summary["timestamp"].startswith("1700000000 (2023-11-")


# -- uneven inputs -----------------------------------------------------------------------
def _every_sharding():
    return {how: uneven_inputs.train(how, use_join=how == "strided")
            for how in uneven_inputs.SHARDINGS}


def test_equal_shards_and_join_match_a_single_process_replay():
    res = ddp_lab.run(_every_sharding, 3, timeout=60, echo=False)
    for how in uneven_inputs.SHARDINGS:
        assert [v[how]["batches"] for v in res] == uneven_inputs.batches_per_rank(how, 3)
        expected = uneven_inputs.replay(how, 3)
        for per_rank in res:
            torch.testing.assert_close(per_rank[how]["weights"], expected)


# -- stragglers --------------------------------------------------------------------------
def test_straggler_script_reports_every_rank_and_marks_the_slow_one():
    times = stragglers.measure(world_size=3, delay=0.02, steps=3)
    assert times.slow_rank == 2 and len(times.step) == 3
    assert all(len(row) == 3 for row in times.step + times.before_backward)
    assert all(b >= 0.02 for b in times.before_backward[2])  # it did sleep


def test_process_group_timeout_shorter_than_the_straggler_fails_in_gloo_words():
    with pytest.raises(ddp_lab.WorkerError) as caught:
        ddp_lab.run_script(stragglers.SCRIPT, 3, timeout=30, echo=False, script_args=
                           stragglers.straggler_args(delay=1.5, steps=1, pg_timeout=1.0))
    assert "Timed out waiting 1000ms" in str(caught.value)
    # the victims raise the timeout; the verdict names the straggler that never joined
    assert caught.value.rank == 2 and sorted(caught.value.victims) == [0, 1]


# -- mismatched collectives -------------------------------------------------------------
def test_mismatches_by_default_and_under_detail():
    assert mismatches.try_mismatch("op")[0] == "hang"
    outcome, line = mismatches.try_mismatch("dtype", mismatches.DETAIL)
    assert outcome == "error" and "Detected mismatch between collectives" in line
    assert mismatches.try_mismatch("dtype")[0] == "crash"
    assert mismatches.try_mismatch("reduce op", mismatches.DETAIL)[0] == "no error"


@pytest.mark.parametrize("backend", ["gloo", "cpu:gloo"])  # the second: a gloo subgroup
def test_monitored_barrier_names_every_missing_rank(backend):
    values = ddp_lab.run(mismatches.stuck_ranks_at_barrier, 4, timeout=30, echo=False,
                         backend=backend).values
    assert "Ranks 1, 3 failed to pass monitoredBarrier" in values[0]
    assert values[1] == values[3] == "was busy elsewhere"


# -- crashes under ddp_lab and torchrun --------------------------------------------------
def test_crash_names_the_root_cause_and_its_knock_on_peers():
    with pytest.raises(ddp_lab.WorkerError) as caught:
        ddp_lab.run_script(crashes.SCRIPT, 3, script_args=crashes.crash_args(1, 1), echo=False)
    assert caught.value.rank == 1 and sorted(caught.value.knock_on) == [0, 2]
    assert "corrupt batch" in caught.value.traceback


def test_torchrun_error_files_hold_the_root_cause():
    crash = crashes.crash_under_torchrun(nproc=2, crash_rank=1, crash_step=1)
    assert crash.result.returncode not in (0, None)
    assert "Root Cause (first observed failure)" in crash.summary
    assert "ValueError: rank 1 read a corrupt batch at step 1" in crash.summary
    assert "ValueError" in crash.error_files[0, 1]["message"]["message"]
    assert crash.result.stopped == ()  # torchrun had stopped its workers itself


def test_torchrun_past_its_timeout_is_stopped_with_all_its_workers():
    # 20 s: on two busy cores the agent and its workers need ~10 s to be up (a shorter
    # timeout stops the agent alone, and the test would prove less)
    result = torchrun([stragglers.SCRIPT, *stragglers.straggler_args(delay=600, steps=1)], 2,
                      timeout=20)
    assert result.returncode is None
    assert len(result.stopped) >= 3, "expected the agent and both workers to be running"
    assert wait_until_gone(result.stopped) == []


def test_rank_prefix_on_tracebacks_comes_from_init_process_group_not_torchrun():
    for rank, lines in enumerate(ddp_lab.run(crashes.excepthook_lines, world_size=2,
                                             args=("boom",), echo=False).values):
        assert lines[0] == "_distributed_excepthook"
        assert lines[-1] == f"[rank{rank}]: ValueError: boom"
        assert all(line.startswith(f"[rank{rank}]: ") for line in lines[1:])
