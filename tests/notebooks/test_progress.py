"""A learner's progress over runs (build/progress.json, `ddp-lab progress`, the front page)
and the live progress of `ddp-lab notebooks`, down to a real course of one notebook with an
exercise that is left as shipped, solved, then broken again.
"""

from __future__ import annotations

import io
import json
import re
import threading
from pathlib import Path

import nbformat
import pytest

from ddp_lab.tools import cli, progress
from ddp_lab.tools.exercise_status import FAILED, NOT_CHECKED, NOT_SOLVED, SOLVED, CheckResult
from ddp_lab.tools.front_page import REFERENCE_PASSED, write_index
from ddp_lab.tools.notebook_report import NotebookReport
from ddp_lab.tools.progress_live import CLEAR_LINE, LiveProgress

md, code = nbformat.v4.new_markdown_cell, nbformat.v4.new_code_cell
T0 = 1_790_000_000.0  # epoch seconds of a first run; later runs an hour apart


def _check(status: str, feedback: str = "", hours: int = 0, name="00.max_over_ranks"):
    return (name, "00_a.ipynb", CheckResult(status, feedback), T0 + 3600 * hours)


# ---- the store --------------------------------------------------------------------------

def test_a_solve_is_kept_when_a_later_run_does_not_solve_it(tmp_path: Path):
    progress.record(tmp_path, [_check(NOT_SOLVED, "Reduce with MAX.")])
    progress.record(tmp_path, [_check(SOLVED, "on 1-4 ranks", hours=1)])
    kept = progress.record(tmp_path, [_check(FAILED, "rank 1 returned 3", hours=2),
                                      _check(NOT_CHECKED, name="02.shift", hours=2)])

    assert set(kept) == {"00.max_over_ranks"}  # a check that did not run records nothing
    p = kept["00.max_over_ranks"]
    assert (p.status, p.feedback, p.checks) == (FAILED, "rank 1 returned 3", 3)
    assert p.ever_solved and p.first_solved_at == progress.local_time(T0 + 3600)
    assert p.last_solved_at == p.first_solved_at and p.checked_at == progress.local_time(
        T0 + 7200)
    assert progress.load(tmp_path) == kept  # what was written is what is read back

    again = progress.record(tmp_path, [_check(SOLVED, hours=3)])["00.max_over_ranks"]
    assert again.first_solved_at == p.first_solved_at  # the first solve stays the first
    assert again.last_solved_at == progress.local_time(T0 + 3 * 3600)


def test_a_store_that_is_not_ours_starts_again(tmp_path: Path):
    (tmp_path / progress.STORE_NAME).write_text("{half a file")
    assert progress.load(tmp_path) == {}
    (tmp_path / progress.STORE_NAME).write_text(json.dumps({"format": 99, "exercises": {}}))
    assert progress.load(tmp_path) == {}
    kept = progress.record(tmp_path, [_check(SOLVED)])
    assert list(kept) == ["00.max_over_ranks"]
    assert not list(tmp_path.glob("*.partial"))


def test_ddp_lab_progress_prints_each_exercise_and_what_to_look_at(tmp_path: Path, capsys):
    assert cli.main(["progress", "--build", str(tmp_path)]) == 1
    assert "no progress recorded" in capsys.readouterr().err

    progress.record(tmp_path, [_check(SOLVED, "ok"),
                               _check(FAILED, "rank 1 returned your own tensor",
                                      name="02.shift")])
    assert cli.main(["progress", "--build", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    solved_row = next(line for line in out.splitlines() if line.startswith("00.max_over"))
    assert re.search(r"00.max_over_ranks\s+solved\s+\d{4}-\d\d-\d\d \d\d:\d\d", solved_row)
    assert re.search(r"^02.shift\s+failed\s+-", out, re.M)
    assert re.search(r"^13.dispatch\s+never checked", out, re.M)
    assert re.search(r"^1 of \d+ exercises solved\.$", out, re.M)
    assert "  02.shift: rank 1 returned your own tensor" in out


def test_progress_help_has_a_description_and_the_default(capsys):
    with pytest.raises(SystemExit):
        cli.main(["progress", "--help"])
    out = " ".join(capsys.readouterr().out.split())  # unwrapped
    assert "progress.json" in out and "(default: build)" in out


# ---- on the front page ------------------------------------------------------------------

def _executed_report(tmp_path: Path, status_line: str) -> NotebookReport:
    build = tmp_path / "build"
    executed = build / "notebooks" / "00_a.ipynb"
    executed.parent.mkdir(parents=True, exist_ok=True)
    stub = code("def max_over_ranks(value):\n    raise NotImplementedError",
                metadata={"tags": ["exercise"], "exercise": "00.max_over_ranks"})
    check = code('ex.check("00.max_over_ranks", max_over_ranks);')
    check.outputs = [nbformat.v4.new_output("stream", name="stdout", text=status_line)]
    nbformat.write(nbformat.v4.new_notebook(cells=[md("# A\n\nIt teaches."), stub, check]),
                   executed)
    return NotebookReport(path=tmp_path / "00_a.ipynb", seconds=2.0, ok=True,
                          executed_path=executed, started_at=T0)


def _exercise_html(page: str) -> str:
    return re.search(r'<li class="exercise">(.*?)</li>', page, re.S).group(1)


def test_the_page_shows_this_runs_status_and_when_it_was_first_solved(tmp_path: Path):
    build = tmp_path / "build"
    page = write_index([_executed_report(tmp_path, "00.max_over_ranks: passed. 4 sizes\n")],
                       build).read_text()
    assert re.search(r"Your exercises: 1 of \d+ solved", page)
    assert f"ran at <span class=\"ran-at\">{progress.local_time(T0)}</span>" in page

    line = "00.max_over_ranks: not solved yet. Reduce with MAX.\n"
    page = write_index([_executed_report(tmp_path, line)], build).read_text()
    exercise = _exercise_html(page)
    assert '<span class="ex-status not-solved-yet">not solved yet</span>' in exercise
    assert f"solved on {progress.local_time(T0)}" in exercise
    assert '<span class="feedback">Reduce with MAX.</span>' in exercise
    assert re.search(r"Your exercises: 1 of \d+ solved", page)  # kept over runs


def test_solved_mode_records_nothing_and_says_the_reference_passed(tmp_path: Path):
    report = _executed_report(tmp_path, "00.max_over_ranks: passed. 4 sizes\n")
    page = write_index([report], tmp_path / "build", solved=True).read_text()
    assert REFERENCE_PASSED in _exercise_html(page)
    assert progress.load(tmp_path / "build") == {}
    assert re.search(r"Your exercises: 0 of \d+ solved", page)


# ---- live progress ----------------------------------------------------------------------

def _wait_for(predicate, what: str) -> None:
    done = threading.Event()
    for _ in range(500):
        if predicate():
            return
        done.wait(0.01)
    raise AssertionError(f"never saw {what}")


def test_a_terminal_gets_one_status_line_redrawn_in_place():
    stream = io.StringIO()
    with LiveProgress(stream, tty=True, tick=0.01) as live:
        live.notebook("[1/2] a.ipynb")
        live.cell(3, 5)
        _wait_for(lambda: stream.getvalue().count("cell 3 of 5") >= 3, "the line redrawn")
        live.done()
        live("[1/2] a.ipynb: ok in 1.0 s")
    text = stream.getvalue()
    assert "\n" not in text.rsplit("[1/2] a.ipynb: ok", 1)[0]  # in place: no new lines
    assert re.search(rf"{re.escape(CLEAR_LINE)}\[1/2\] a\.ipynb: cell 3 of 5, \d+ s", text)
    assert text.endswith(CLEAR_LINE + "[1/2] a.ipynb: ok in 1.0 s\n")  # status line gone


def test_a_log_gets_lines_at_most_one_per_cell_and_none_in_a_quiet_spell():
    quiet_log, busy_log = io.StringIO(), io.StringIO()
    with LiveProgress(quiet_log, tty=False, tick=0.01, quiet=3600) as live:
        live.notebook("[1/1] a.ipynb")
        for number in range(1, 61):
            live.cell(number, 60)
    assert quiet_log.getvalue().splitlines() == ["[1/1] a.ipynb: starting its kernel, 0 s"]

    with LiveProgress(busy_log, tty=False, tick=0.01, quiet=0) as live:
        live.notebook("[1/1] a.ipynb")
        for number in range(1, 4):
            live.cell(number, 3)
        _wait_for(lambda: "cell 3 of 3" in busy_log.getvalue(), "the busy cell's line")
        threading.Event().wait(0.1)  # ticks that must not repeat the busy cell's line
    lines = busy_log.getvalue().splitlines()
    cells = [re.search(r"cell (\d+) of 3", line).group(1) for line in lines[1:]]
    assert "\r" not in busy_log.getvalue() and len(cells) == len(set(cells)) <= 3


# ---- a real course: left as shipped, solved, broken again ------------------------------

SOLUTION = ("import torch\nimport torch.distributed as dist\n\n"
            "def max_over_ranks(value):\n"
            "    t = torch.tensor([float(value)], dtype=torch.float64)\n"
            "    dist.all_reduce(t, op=dist.ReduceOp.MAX)\n    return t.item()")


def _course(folder: Path, exercise_source: str) -> None:
    """Notebook 00's exercise and, after it, a check of another function that passes
    (a notebook may check other code with the same checker, to teach): the page must report
    the learner's check only."""
    stub = code(exercise_source, metadata={"tags": ["exercise"], "exercise": "00.max_over_ranks"})
    cells = [md("# 00 · Tiny\n\nIn this notebook:\n\n1. **max over ranks**: an all-reduce;\n"
                "2. checking it."),
             stub,
             code('import ddp_lab.exercises as ex\nex.check("00.max_over_ranks", max_over_ranks);'),
             code(SOLUTION.replace("max_over_ranks", "another_max") +
                  '\n\nreport = ex.check("00.max_over_ranks", another_max)\n'
                  'assert "passed" in report')]
    folder.mkdir(exist_ok=True)
    nbformat.write(nbformat.v4.new_notebook(cells=cells), folder / "00_tiny.ipynb")


def _run(course: Path, build: Path, capsys) -> tuple[str, str]:
    code_ = cli.main(["notebooks", "--dir", str(course), "--build", str(build),
                      "--timeout", "120"])
    out = capsys.readouterr().out
    page = (build / "index.html").read_text()
    assert code_ == 0, out
    return out, _exercise_html(page)


@pytest.mark.slow
@pytest.mark.timeout(420)
def test_a_course_run_as_shipped_then_solved_then_broken(tmp_path: Path, capsys):
    course, build = tmp_path / "notebooks", tmp_path / "build"
    stub = "def max_over_ranks(value):\n    raise NotImplementedError"
    _course(course, stub)
    out, exercise = _run(course, build, capsys)
    assert "ex-status not-solved-yet" in exercise and "solved on" not in exercise
    assert re.search(r"^\[1/1\] 00_tiny\.ipynb: (starting its kernel|cell \d of 3), \d+ s$",
                     out, re.M)  # live progress, line by line (pytest's stdout is no TTY)
    assert "\r" not in out
    page = (build / "index.html").read_text()
    assert "Max over ranks · checking it" in page  # the card: what the notebook teaches

    _course(course, SOLUTION)
    _, exercise = _run(course, build, capsys)
    assert '<span class="ex-status solved">solved</span>' in exercise

    _course(course, stub)
    _, exercise = _run(course, build, capsys)
    assert "ex-status not-solved-yet" in exercise and "solved on" in exercise
    kept = progress.load(build)["00.max_over_ranks"]
    assert (kept.status, kept.checks, kept.ever_solved) == (NOT_SOLVED, 3, True)
