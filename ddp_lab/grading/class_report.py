"""The class's files: ``grades.csv`` (a row per submission, a column per exercise, the
total) and ``summary.html`` (per exercise: how many solved it, the most common failure).

The HTML is plain (no script, no link to anything outside it) so that it opens offline.
A failure's message names its trial ("on 3 ranks (seed 1234), rank 2: ..."), different for
every submission; the summary counts messages with that trial left out, so that the same
mistake is counted once however its trial went.
"""

from __future__ import annotations

import csv
import html
import re
from collections import Counter
from pathlib import Path

from ddp_lab.exercises.registry import all_exercises
from ddp_lab.grading.results import PASSED, SubmissionGrade

TRIAL = re.compile(r"^on \d+ ranks? \(seed \d+\)(, rank \d+)?[:,]?\s*")


def class_exercises(grades: list[SubmissionGrade]) -> list[str]:
    """Every exercise any submission was graded on, in course order."""
    seen = {e.exercise for g in grades for e in g.exercises}
    return [name for name in all_exercises() if name in seen]


def write_grades_csv(grades: list[SubmissionGrade], path: Path) -> None:
    exercises = class_exercises(grades)
    with path.open("w", newline="", encoding="utf-8") as f:
        out = csv.writer(f)
        out.writerow(["submission", *exercises, "total", "max"])
        for grade in grades:
            scores = {e.exercise: f"{e.score:g}" for e in grade.exercises}
            out.writerow([grade.name, *(scores.get(e, "") for e in exercises),
                          f"{grade.score:g}", f"{grade.max_score:g}"])


def common_failure(messages: list[str]) -> tuple[str, int]:
    """The most common failure (its first line, the trial left out) and how often."""
    if not messages:
        return "", 0
    lines = [TRIAL.sub("", (m.strip().splitlines() or [""])[0]) for m in messages]
    return Counter(lines).most_common(1)[0]


def summary_rows(grades: list[SubmissionGrade]) -> list[tuple[str, int, int, str, int]]:
    """(exercise, solved, graded, most common failure, its count) per exercise."""
    rows = []
    for name in class_exercises(grades):
        graded = [e for g in grades for e in g.exercises if e.exercise == name]
        failures = [f"{e.status}: {e.output}" if e.status != "failed" else e.output
                    for e in graded if e.status != PASSED]
        message, count = common_failure(failures)
        rows.append((name, sum(e.status == PASSED for e in graded), len(graded), message,
                     count))
    return rows


def write_summary_html(grades: list[SubmissionGrade], path: Path) -> None:
    cells = "".join(
        f"<tr><td>{html.escape(name)}</td><td>{solved} / {graded}</td>"
        f"<td>{html.escape(message) or '&mdash;'}</td><td>{count or ''}</td></tr>\n"
        for name, solved, graded, message, count in summary_rows(grades))
    totals = "".join(f"<tr><td>{html.escape(g.name)}</td><td>{g.score:g} / "
                     f"{g.max_score:g}</td><td>{html.escape('; '.join(g.notes))}</td></tr>\n"
                     for g in grades)
    path.write_text(f"""<!doctype html>
<html><head><meta charset="utf-8"><title>ddp-lab grades</title>
<style>body{{font-family:sans-serif;margin:2em}} table{{border-collapse:collapse}}
td,th{{border:1px solid #ccc;padding:4px 8px;vertical-align:top}}</style></head><body>
<h1>ddp-lab grades: {len(grades)} submission{'s' if len(grades) != 1 else ''}</h1>
<h2>Per exercise</h2>
<table><tr><th>exercise</th><th>solved</th><th>most common failure</th><th>times</th></tr>
{cells}</table>
<h2>Per submission</h2>
<table><tr><th>submission</th><th>score</th><th>notes</th></tr>
{totals}</table>
</body></html>
""", encoding="utf-8")
