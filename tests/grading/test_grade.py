"""``ddp-lab grade`` on the test class (tests/grading/class/, built by make_class.py): the
expected score and status of every exercise of every submission, each hostile submission
contained (nothing written outside, the checkers intact, no process, temp folder or /dev/shm
entry left), and the right submission, graded in the same run, with full marks.

The whole class is graded once, as an instructor would (two at a time on two cores), with
a 10 s budget per kernel cell so that the cell that loops for ever costs 10 s.
"""

from __future__ import annotations

import csv
import glob
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil
import pytest

from ddp_lab.grading.grade import grade_class
from ddp_lab.grading.one_submission import Budgets
from ddp_lab.grading.sandbox import run_sandboxed

HERE = Path(__file__).resolve().parent
CLASS = HERE / "class"
sys.path.insert(0, str(HERE))
import make_class  # noqa: E402  (the class's own description: paths the hostiles aim at)

EXPECTED = json.loads((CLASS / "expected.json").read_text())
SUBMISSIONS = sorted(p for p in CLASS.iterdir() if p.name != "expected.json")
pytestmark = [pytest.mark.slow, pytest.mark.alone]


def _grade_temp_folders() -> set[str]:
    return set(glob.glob(os.path.join(tempfile.gettempdir(), "ddp-lab-grade-*")))


def _package_is_read_only_in_the_sandbox() -> bool:
    """A probe before the class runs: the hostile submissions really try to delete a
    checker, so the sandbox must first be seen to refuse a harmless write there."""
    probe = make_class.CHECKER_FILE.with_name(".grade-probe")
    with tempfile.TemporaryDirectory() as parent:
        folder = Path(parent) / "probe"
        folder.mkdir()
        run_sandboxed([sys.executable, "-c", f"open({str(probe)!r}, 'w')"], folder,
                      wall_s=30, memory_bytes=2 << 30, max_processes=64)
    written = probe.exists()
    probe.unlink(missing_ok=True)
    return not written


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    assert _package_is_read_only_in_the_sandbox(), "the sandbox let a write into the package"
    before = {"temp": _grade_temp_folders(), "shm": set(os.listdir("/dev/shm"))}
    out = tmp_path_factory.mktemp("grades")
    grades = grade_class(SUBMISSIONS, out, jobs=2, budgets=Budgets(cell_s=10.0),
                         progress=lambda line: None)
    after = {"temp": _grade_temp_folders(), "shm": set(os.listdir("/dev/shm"))}
    return {g.name: g for g in grades}, out, before, after


@pytest.mark.timeout(1200)
@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_every_submission_gets_its_expected_grade(graded, name):
    grades, out, _, _ = graded
    grade, want = grades[name], EXPECTED[name]
    got = {e.exercise: e.status for e in grade.exercises}
    said = {e.exercise: e.output for e in grade.exercises}
    assert got == want["statuses"], (said, grade.notes)
    assert grade.score == want["score"]
    results = json.loads((out / name / "results.json").read_text())
    assert results["score"] == want["score"]
    assert [t["name"] for t in results["tests"]] == list(want["statuses"])


def test_zeros_say_why(graded):
    grades, _, _, _ = graded
    said = {name: " ".join([e.output for e in g.exercises] + g.notes)
            for name, g in grades.items()}
    assert "not a readable notebook" in said["does_not_parse"]
    assert "not a course notebook" in said["not_a_course_notebook"]
    assert "no function my_all_gather in the notebook" in said["missing_exercise"]
    assert "no function my_shift in the notebook" in said["missing_exercise"]
    assert "ran past the 10 s a cell may run" in said["loop_forever"]
    assert "hung" in said["hang_in_collective"]
    assert "out of reach" in said["import_reference"]
    assert "No such file or directory" in said["read_other"]  # hidden, not merely unreadable
    assert "sum" in said["patch_check"]  # the wrong function's mistake, not a passed check
    for name in ("write_outside", "delete_checkers"):
        assert "Read-only file system" in said[name] or "Permission denied" in said[name]


def test_hostile_submissions_are_contained(graded):
    _, _, before, after = graded
    assert not Path(make_class.OUTSIDE).exists()
    assert make_class.CHECKER_FILE.is_file()
    assert subprocess.run(["git", "diff", "--quiet", "--", str(make_class.CHECKER_FILE)],
                          cwd=make_class.ROOT).returncode in (0, 1)  # git can still read it
    assert after["temp"] <= before["temp"], "a grading temp folder was left behind"
    assert after["shm"] <= before["shm"], "a /dev/shm entry was left behind"


def test_the_class_files(graded):
    grades, out, _, _ = graded
    rows = {row["submission"]: row for row in csv.DictReader((out / "grades.csv").open())}
    assert set(rows) == set(grades)
    assert rows["right"]["total"] == "4" and rows["partly"]["total"] == "2"
    page = (out / "summary.html").read_text()
    assert "02.shift" in page and "<script" not in page
    assert (out / "right" / "report.md").read_text().startswith("# right")


@pytest.mark.timeout(180)
@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_an_interrupted_grade_stops_its_sandboxes_and_leaves_nothing(tmp_path, signum):
    """Ctrl-C (or SIGTERM) while a kernel loops for ever: the grader ends within seconds,
    not at the cell's 120 s, with no sandbox, process or temp folder left."""
    before = _grade_temp_folders()
    grader = subprocess.Popen(
        [sys.executable, "-m", "ddp_lab", "grade", str(CLASS / "loop_forever.ipynb"),
         "--out", str(tmp_path / "out"), "--cell-timeout", "120"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        while not _running_sandbox(grader.pid) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert _running_sandbox(grader.pid), "no sandbox started within 60 s"
        time.sleep(3)  # the kernel is in its loop by now, or about to be
        started = time.monotonic()
        grader.send_signal(signum)
        _, err = grader.communicate(timeout=60)
    finally:
        if grader.poll() is None:
            grader.kill()
            grader.wait()
    assert time.monotonic() - started < 20, err
    assert grader.returncode == 130, err
    assert "interrupted" in err
    assert _grade_temp_folders() <= before


def _running_sandbox(pid: int) -> bool:
    try:
        return any("sandbox_helper" in " ".join(c.cmdline())
                   for c in psutil.Process(pid).children())
    except psutil.Error:
        return False


def test_the_fork_bombs_zero_says_why(graded):
    """The process budget stops it, or (on a loaded machine) the cell's time runs out first."""
    grades, _, _, _ = graded
    assert _why(grades["fork_bomb"]), grades["fork_bomb"]


def test_a_fork_bomb_interrupted_mid_fork_still_says_why(tmp_path):
    """With 1 s a cell, the bomb's cell always times out before the process budget: the
    interrupt wakes its children as copies of the kernel, which then never sends the cell's
    error output. The reason comes from the reply (nbclient's, at the timeout)."""
    grades = grade_class([CLASS / "fork_bomb.ipynb"], tmp_path / "out", jobs=1,
                         budgets=Budgets(cell_s=1.0), progress=lambda line: None)
    assert [e.status for e in grades[0].exercises] == ["missing"]
    assert _why(grades[0]), grades[0]


def _why(grade) -> bool:
    said = " ".join([e.output for e in grade.exercises] + grade.notes)
    return any(reason in said for reason in ("processes", "Resource temporarily unavailable",
                                             "raised TimeoutError"))
