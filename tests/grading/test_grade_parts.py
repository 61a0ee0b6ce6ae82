"""The grader's parts without a kernel: which cells run, which notebook a file is, the signed
results, the payload that is never unpickled by the grader, the class's files."""

from __future__ import annotations

import csv
import json
import pickle
from pathlib import Path

import nbformat
import pytest

import ddp_lab.exercises as ex
from ddp_lab.exercises.registry import find
from ddp_lab.exercises.sealed import Sealed
from ddp_lab.grading import results as r
from ddp_lab.grading.checking import (FAILED, PASSED, CheckOutcome, check_one, read_results,
                                      signed_line)
from ddp_lab.grading.class_report import common_failure, write_grades_csv, write_summary_html
from ddp_lab.grading.grade import submission_names
from ddp_lab.grading.kernel_cells import definitions_only, kernel_notebook
from ddp_lab.grading.submission import read_submission
from ddp_lab.launch import payload

ROOT = Path(__file__).resolve().parents[2]
NB02 = ROOT / "notebooks" / "02_point_to_point.ipynb"


def test_only_definitions_of_other_cells_run():
    source = ("%matplotlib inline\nimport torch\n@decorate()\ndef helper(x):\n    return x\n"
              "result = helper(2)\nSIZE = 4\nhelper(1)\nclass A:\n    pass\n")
    kept = definitions_only(source)
    assert kept == ("import torch\n@decorate()\ndef helper(x):\n    return x\nSIZE = 4\n"
                    "class A:\n    pass")
    assert definitions_only("%%ddp -n 2\nx = 1\n") == ""
    assert definitions_only("def broken(:\n") == ""


def test_the_kernel_notebook_keeps_exercise_cells_whole_and_dumps_after_each(tmp_path):
    submission = read_submission(NB02, "s")
    (notebook,) = submission.notebooks
    cells = kernel_notebook(notebook).cells
    exercises = [c.metadata["exercise"] for c in cells if "exercise" in c.metadata]
    assert exercises == ["02.all_gather", "02.shift"]
    for i, cell in enumerate(cells):
        if "exercise" in cell.metadata:
            assert "__ddp_lab_grade_dump" in cells[i + 1].source
    assert not any("ex.check" in c.source or "measure_ping_pong" in c.source for c in cells)


def test_a_missing_function_is_explained_by_the_cell_that_failed_first():
    """Its own cell's error, else the cell that saves it (a kernel its cell wedged), else the
    first error before it (an import that timed out), else the kernel's end."""
    from ddp_lab.grading.one_submission import _by_exercise
    (notebook,) = read_submission(NB02, "s").notebooks
    cells = kernel_notebook(notebook).cells
    at = {c.metadata["exercise"]: i for i, c in enumerate(cells) if "exercise" in c.metadata}
    first, second = at["02.all_gather"], at["02.shift"]
    assert _by_exercise(notebook, {first: "NameError: x", second + 1: "TimeoutError: t"}) == {
        "02.all_gather": "its cell raised NameError: x",
        "02.shift": "the cell that saves it raised TimeoutError: t"}
    assert _by_exercise(notebook, {0: "TimeoutError: t", first: "ValueError: v"}) == {
        "02.all_gather": "its cell raised ValueError: v",
        "02.shift": "a cell before it raised TimeoutError: t"}
    assert _by_exercise(notebook, {-1: "the kernel stopped: DeadKernelError"}) == {
        e: "the kernel stopped: DeadKernelError" for e in at}
    assert _by_exercise(notebook, {}) == {}


def test_a_notebook_is_known_by_its_exercises_else_by_its_number(tmp_path):
    nb = nbformat.read(NB02, as_version=4)
    nbformat.write(nb, tmp_path / "homework (1).ipynb")
    for cell in nb.cells:
        cell.metadata.pop("exercise", None)
    nbformat.write(nb, tmp_path / "02_mine.ipynb")
    nbformat.write(nb, tmp_path / "notes.ipynb")
    found = read_submission(tmp_path, "s")
    assert [n.name for n in found.notebooks] == ["02_point_to_point"]
    reasons = " ".join(r.reason for r in found.rejected)
    assert "second copy of 02_point_to_point" in reasons
    assert "notes.ipynb is not a course notebook" in reasons


def test_stubs_are_not_attempted():
    (notebook,) = read_submission(NB02, "s").notebooks
    assert notebook.is_stub("02.all_gather") and notebook.functions["02.shift"] == "my_shift"


def test_names_are_unique_and_safe(tmp_path):
    (tmp_path / "a b.ipynb").write_text("{}")
    (tmp_path / "x").mkdir()
    (tmp_path / "x" / "a b.ipynb").write_text("{}")
    assert submission_names([tmp_path / "a b.ipynb", tmp_path / "x" / "a b.ipynb",
                             tmp_path / "x"]) == ["a_b", "a_b-2", "x"]


def test_only_lines_signed_with_the_key_count():
    key, other = b"k" * 32, b"o" * 32
    real = CheckOutcome("00.max_over_ranks", "failed", "wrong")
    forged = CheckOutcome("00.max_over_ranks", "passed", "")
    stdout = "\n".join([signed_line(forged, other), "ddp-lab-check:00 {}",
                        signed_line(real, key), signed_line(forged, key)])
    assert read_results(stdout, key) == {"00.max_over_ranks": real}


def test_the_grader_never_unpickles_the_payload(tmp_path):
    """A payload that runs code when unpickled runs it only inside the sealed call, as
    check_one hands it to a checker."""
    marker = tmp_path / "unpickled"
    wrapped = Sealed.from_pickled(pickle.dumps(_Trap(str(marker))), find("00.max_over_ranks"),
                                  "max_over_ranks")
    payload.dumps(wrapped)  # what the checker does to send it to the ranks
    assert not marker.exists()
    with pytest.raises(Exception, match="closed"):
        wrapped(1.0)  # unpickled here, inside the seal: the file door is closed
    assert not marker.exists()


class _Trap:
    def __init__(self, path: str):
        self.path = path

    def __reduce__(self):
        return open, (self.path, "w")


def test_a_payload_check_runs_the_checker_on_the_function():
    right = _cell("def f(value):\n    import torch, torch.distributed as dist\n"
                  "    t = torch.tensor([float(value)], dtype=torch.float64)\n"
                  "    dist.all_reduce(t, op=dist.ReduceOp.MAX)\n    return t.item()\n")
    good = check_one("00.max_over_ranks", payload.dumps(right), "max_over_ranks")
    bad = check_one("00.max_over_ranks", payload.dumps(_cell("def f(value):\n    return 2\n")),
                    "max_over_ranks")
    assert good.status == PASSED and bad.status == FAILED, (good, bad)
    assert bad.output.startswith("on ") and len(bad.output.splitlines()) <= 12


def _cell(source: str):
    """``f`` as a kernel defines it: in ``__main__``, so that it travels by value."""
    namespace = {"__name__": "__main__"}
    exec(compile(source, "<cell>", "exec"), namespace)
    return namespace["f"]


def test_results_json_is_gradescope_shaped(tmp_path):
    grade = r.SubmissionGrade("alice", "alice.ipynb", [
        r.ExerciseGrade("02.all_gather", r.PASSED, "fine"),
        r.ExerciseGrade("02.shift", r.FAILED, "on 2 ranks (seed 5), rank 0: wrong")])
    r.write_submission(grade, tmp_path / "alice")
    data = json.loads((tmp_path / "alice" / "results.json").read_text())
    assert data["score"] == 1.0 and len(data["tests"]) == 2
    test = data["tests"][1]
    assert set(test) >= {"name", "score", "max_score", "output", "visibility"}
    assert (test["score"], test["max_score"], test["visibility"]) == (
        0.0, float(find("02.shift").points), find("02.shift").visibility)
    assert "02.shift: failed" in (tmp_path / "alice" / "report.md").read_text()


def test_class_files_count_solved_and_the_common_failure(tmp_path):
    grades = [r.SubmissionGrade(n, n, [r.ExerciseGrade("02.shift", s, o)]) for n, s, o in (
        ("a", r.FAILED, "on 2 ranks (seed 1), rank 0: wrong direction"),
        ("b", r.FAILED, "on 3 ranks (seed 9), rank 2: wrong direction"),
        ("c", r.PASSED, "ok"))]
    write_grades_csv(grades, tmp_path / "grades.csv")
    rows = list(csv.reader((tmp_path / "grades.csv").open()))
    assert rows[0] == ["submission", "02.shift", "total", "max"] and rows[3][1:3] == ["1", "1"]
    write_summary_html(grades, tmp_path / "summary.html")
    page = (tmp_path / "summary.html").read_text()
    assert "2 / 3" not in page and "1 / 3" in page and "wrong direction" in page
    assert "http" not in page and "<script" not in page
    assert common_failure(["x: y", "on 1 rank (seed 3): z", "on 2 ranks (seed 4), rank 1: z"]) \
        == ("z", 2)


def test_every_exercise_has_a_function_name_in_the_shipped_notebooks():
    from ddp_lab.grading.submission import course_functions
    names = {e for functions in course_functions().values() for e in functions}
    assert names == set(ex.names())


def test_the_command_refuses_bad_input_before_running_anything(tmp_path, capsys):
    from ddp_lab.tools.cli import main
    assert main(["grade", str(tmp_path / "nope.ipynb"), "--out", str(tmp_path / "o")]) == 2
    assert "no such submission" in capsys.readouterr().err
    assert main(["grade", str(NB02), "--out", str(tmp_path / "o"), "--jobs", "0"]) == 2
    assert "--jobs must be at least 1" in capsys.readouterr().err
    assert main(["grade", str(NB02), str(NB02), "--out", str(tmp_path / "o"),
                 "--results-json", str(tmp_path / "r.json")]) == 2
    assert not (tmp_path / "o").exists()


def test_the_bench_class_spans_every_score(tmp_path):
    from ddp_lab.grading.submission import COURSE_DIR, read_submission as read
    from ddp_lab.tools.bench_grade import make_class
    expected = make_class(tmp_path, 10, COURSE_DIR)
    assert sorted(set(expected.values())) == [0, 1, 2, 3, 4]
    for name, score in expected.items():
        submission = read(tmp_path / name, name)
        attempted = [e for e, nb in submission.exercises().items() if not nb.is_stub(e)]
        assert len(submission.exercises()) == 4 and len(attempted) == score


def test_a_kernel_that_left_many_processes_running_is_noted(tmp_path):
    """A fork bomb whose cell ran out of time before the process budget stopped it: the
    harvest counts what is left in its sandbox, and the grade says so."""
    import sys

    from ddp_lab.grading.one_submission import _note_left
    from ddp_lab.grading.sandbox import run_sandboxed
    forks = ("import os, time\nfrom ddp_lab.grading.harvest import left_running\n"
             "for _ in range(20):\n    if os.fork() == 0:\n        time.sleep(30)\n"
             "        os._exit(0)\nprint(left_running())\n")
    folder = tmp_path / "fork"
    folder.mkdir()
    done = run_sandboxed([sys.executable, "-c", forks], folder, wall_s=60,
                         memory_bytes=4 << 30, max_processes=256)
    assert done.stdout.strip() == "20", done
    notes = []
    _note_left("ddp-lab-harvest:{}\nddp-lab-harvest-left:300\n", notes)
    assert notes == ["the notebook's kernel left 300 processes running (stopped with its "
                     "sandbox): a cell forked them and never waited for them"]
    _note_left("ddp-lab-harvest-left:2\n", notes)
    assert len(notes) == 1  # a fork server on its way out is no fork bomb
