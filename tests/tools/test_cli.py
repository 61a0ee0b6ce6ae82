"""The ddp-lab command: doctor, run, bench launch (as a user types them)."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from ddp_lab.tools.bench_launch import LaunchTimes, format_report, missed_targets
from ddp_lab.tools.cli import main
from ddp_lab.course.ch00_launching.plots import launch_latency

pytestmark = pytest.mark.timeout(240)


def test_doctor_gives_a_verdict(capsys):
    assert main(["doctor"]) == 0
    out = capsys.readouterr().out
    assert "backends: gloo yes" in out and "[ok] 2-rank all_reduce" in out
    assert "READY" in out


def test_run_demo_prints_tagged_output_and_values(capsys):
    assert main(["run", "all_reduce", "-n", "3"]) == 0
    out = capsys.readouterr().out
    assert "[rank 2] after all_reduce: [3.0]" in out
    assert "rank 1 returned: [3.0]" in out


def test_run_demo_failure_exits_nonzero_with_the_root_cause(capsys):
    assert main(["run", "crash", "-n", "2"]) == 1
    err = capsys.readouterr().err
    assert "rank 1 failed" in err and "read a corrupt batch" in err


def test_unknown_demo_lists_the_choices(capsys):
    assert main(["run", "nope"]) == 1
    assert "choose one of: all_gather, all_reduce, all_to_all" in capsys.readouterr().err


@pytest.mark.parametrize("demo", ["hang", "deadlock"])
def test_demos_that_hang_stop_in_seconds_with_the_stacks(demo, capsys):
    import time
    start = time.monotonic()
    assert main(["run", demo, "-n", "2"]) == 1
    assert time.monotonic() - start < 40  # the 5 s default plus start-up, not 60 s
    err = capsys.readouterr().err
    assert "timed out after 5 s" in err, err[:800]
    assert f"'{demo}' hangs on purpose" in err


def test_bench_launch_reports_every_launcher_and_leaves_no_folder(tmp_path):
    """One run of the bench as a user types it: every launcher and the ratios reported, and
    nothing left in its temp folder. torchrun without --log-dir leaves a new
    $TMPDIR/torchelastic_* per run; a private TMPDIR keeps other torchrun runs on the
    machine out of the comparison, and shows the bench's own --log-dir folder is removed."""
    out = subprocess.run([sys.executable, "-m", "ddp_lab", "bench", "launch", "-n", "2",
                          "--repeats", "1", "--warm-repeats", "2"],
                         capture_output=True, text=True, timeout=200,
                         env={**os.environ, "TMPDIR": str(tmp_path)})
    # A loaded machine can miss a target: then, and only then, the exit code says so.
    missed = "MISSED" in out.stdout
    assert out.returncode == (1 if missed else 0), out.stderr
    assert ("a target was MISSED" in out.stderr) == missed
    for launcher in ("torchrun", "mp.spawn script", "ddp_lab cold", "ddp_lab warm",
                     "ddp_lab call 1", "ddp_lab call 2", "ddp_lab call 3"):
        assert launcher in out.stdout
    assert "faster than torchrun (target >= 15x)" in out.stdout
    assert "torchrun's time (target <= 0.6x)" in out.stdout
    assert "call 2 takes" in out.stdout and "its call 3 (target <= 2x)" in out.stdout
    assert not list(tmp_path.glob("torchelastic_*")), sorted(tmp_path.iterdir())
    assert not list(tmp_path.glob("ddp_lab_bench-*")), "the bench's --log-dir was left behind"
    assert not list(tmp_path.glob("ddp_lab-*")), "a run folder was left behind"


def test_report_and_figure_come_from_the_measurements():
    firsts = {"ddp_lab call 1": [1.5], "ddp_lab call 2": [0.12], "ddp_lab call 3": [0.1]}
    times = LaunchTimes(4, {"torchrun": [4.0, 5.0], "mp.spawn script": [4.5],
                            "ddp_lab cold": [2.0], "ddp_lab warm": [0.1, 0.2, 0.3], **firsts})
    assert times.warm_speedup == pytest.approx(22.5)
    assert times.cold_ratio == pytest.approx(2.0 / 4.5)
    assert times.second_call_ratio == pytest.approx(1.2)
    report = format_report(times)
    assert "22.5x faster" in report and ": met" in report and "1.20x its call 3" in report
    assert missed_targets(times) == [] and "MISSED" not in report
    slow = LaunchTimes(4, {"torchrun": [4.0], "ddp_lab cold": [3.0], "ddp_lab warm": [1.0],
                           **firsts, "ddp_lab call 2": [1.1]})
    assert missed_targets(slow) == ["warm speed-up", "cold ratio", "second call"]
    assert format_report(slow).count("MISSED") == 3
    fig = launch_latency(times)
    ax = fig.axes[0]
    assert [t.get_text() for t in ax.get_yticklabels()] == list(times.seconds)
    assert [round(p.get_width(), 3) for p in ax.patches] == [4.5, 4.5, 2.0, 0.2, 1.5, 0.12, 0.1]


def test_bench_allreduce_prints_the_table_and_saves_the_figures(tmp_path, capsys):
    code = main(["bench", "allreduce", "-n", "2", "--sizes", "1024", "65536",
                 "--repeats", "2", "--out", str(tmp_path)])
    assert code == 0
    out = capsys.readouterr().out
    assert "ring" in out and "gloo" in out
    assert sorted(p.name for p in tmp_path.glob("*.png")) == [
        "allreduce_bytes.png", "allreduce_curves.png", "allreduce_threads.png"]


def test_bench_ddp_ends_with_the_scaling_line(capsys):
    code = main(["bench", "ddp", "--steps", "2", "--repeats", "1", "--batch", "4"])
    assert code == 0
    out = capsys.readouterr().out
    assert "ranks  samples/s  speed-up" in out
    assert re.search(r"^scaling 1->2 ranks: \d+\.\d\dx samples/s$", out.strip().splitlines()[-1])


def test_bench_network_compares_configured_and_measured(capsys):
    code = main(["bench", "network", "--bandwidths", "200mbit", "--latency", "1ms",
                 "--repeats", "1"])
    assert code == 0
    out = capsys.readouterr().out
    row = next(line for line in out.splitlines() if line.startswith("Network('200mbit')"))
    ratio = float(row.split()[5])
    assert 0.85 < ratio < 1.15, row
    latency_row = next(line for line in out.splitlines() if "latency='1ms'" in line)
    assert "refused: latency='1ms' needs the netem qdisc" in latency_row or "1000 us" in latency_row
    assert out.splitlines()[2].startswith("loopback (network=None)")


def test_bench_ddp_network_times_each_lesson_on_its_link(tmp_path, capsys):
    figure = tmp_path / "net.png"
    code = main(["bench", "ddp-network", "--batch", "32", "--iterations", "1",
                 "--overlap-network", "2gbit", "--out", str(figure)])
    assert code == 0 and figure.stat().st_size > 0
    out = capsys.readouterr().out
    header = next(line for line in out.splitlines() if line.strip().startswith("setting"))
    columns = header.split()[1:]
    assert columns[:4] == ["loopback", "overlap", "2gbit", "compression"] \
        and columns[4].endswith("mbit")  # the compression link: matched to this machine
    assert "fp16 hook" in out and "PowerSGD hook" in out and "no overlap" in out
    shaped = next(line for line in out.splitlines() if line.strip().startswith("shaped"))
    assert all(name in shaped for name in ("buckets", "overlap", "fp16 hook", "PowerSGD hook"))


def test_bench_ddp_network_refuses_a_bad_rate_before_any_rank_starts(capsys):
    assert main(["bench", "ddp-network", "--compression-network", "fast"]) == 2
    captured = capsys.readouterr()
    assert "bandwidth='fast' is not understood" in captured.err and captured.out == ""


def test_bench_ranks_judges_the_calls_own_cost_not_the_collective():
    """The all_reduce call's target is on its round trip less the collective (the same gloo
    all_reduce whoever asks), the trivial call's on its round trip; MISSED says which."""
    from ddp_lab.tools.bench_ranks import RoundTrips, format_report, missed
    trips = RoundTrips(4, ms={("ddp_lab.Ranks", "trivial"): [0.3, 0.3],
                              ("ipyparallel", "trivial"): [6.0, 6.0],
                              ("ddp_lab.run warm", "trivial"): [100.0],
                              ("ddp_lab.Ranks", "all_reduce"): [0.9, 0.9],
                              ("ipyparallel", "all_reduce"): [6.6, 6.6],
                              ("ddp_lab.run warm", "all_reduce"): [110.0]},
                      collective_ms={"ddp_lab.Ranks": [0.6, 0.6], "ipyparallel": [0.6, 0.6]})
    assert trips.own_cost("ddp_lab.Ranks") == pytest.approx(0.3)
    assert trips.own_speedup() == pytest.approx(20.0) and not missed(trips)
    assert "MISSED" not in format_report(trips)  # 6.6 / 0.9 overall: the collective's share
    trips.ms["ipyparallel", "all_reduce"] = [2.0, 2.0]
    assert missed(trips) and "all_reduce call's own cost" in format_report(trips)
