"""A submission's grade, and the two files each submission gets: ``results.json`` in
Gradescope's format (one test per exercise) and ``report.md`` for a person.

Gradescope's format: https://gradescope-autograders.readthedocs.io/en/latest/specs/
(``score``, ``output``, ``tests: [{name, score, max_score, status, output, visibility}]``).
Points and visibility come from the registry (``Exercise.points``, ``.visibility``), and
nowhere else.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from ddp_lab.exercises.registry import find

# Statuses of an exercise; only PASSED scores.
PASSED = "passed"
FAILED = "failed"
NOT_SOLVED = "not solved yet"
NOT_ATTEMPTED = "not attempted"
MISSING = "missing"
NOT_CHECKED = "not checked"


@dataclass(frozen=True)
class ExerciseGrade:
    """One exercise of one submission: its status and the feedback's first lines."""

    exercise: str
    status: str
    output: str

    @property
    def max_score(self) -> float:
        return float(find(self.exercise).points)

    @property
    def score(self) -> float:
        return self.max_score if self.status == PASSED else 0.0

    def as_test(self) -> dict:
        """A test of Gradescope's results.json."""
        return {"name": self.exercise, "score": self.score, "max_score": self.max_score,
                "status": "passed" if self.status == PASSED else "failed",
                "output": f"{self.status}: {self.output}".strip().rstrip(":"),
                "visibility": find(self.exercise).visibility}


@dataclass
class SubmissionGrade:
    """Every exercise's grade of one submission, and what concerns it as a whole (a
    notebook that is not a course notebook, a kernel that ran past its budget)."""

    name: str
    source: str
    exercises: list[ExerciseGrade] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def score(self) -> float:
        return sum(e.score for e in self.exercises)

    @property
    def max_score(self) -> float:
        return sum(e.max_score for e in self.exercises)

    def results_json(self) -> dict:
        return {"score": self.score,
                "output": "\n".join(self.notes) or _graded(len(self.exercises)),
                "execution_time": round(self.seconds, 1),
                "tests": [e.as_test() for e in self.exercises]}

    def report_md(self) -> str:
        lines = [f"# {self.name}", "", f"Source: `{self.source}`", "",
                 f"**Score: {self.score:g} / {self.max_score:g}**", ""]
        lines += [f"- {note}" for note in self.notes] + ([""] if self.notes else [])
        lines += ["| exercise | score | status |", "|---|---|---|"]
        lines += [f"| {e.exercise} | {e.score:g} / {e.max_score:g} | {e.status} |"
                  for e in self.exercises]
        for e in self.exercises:
            lines += ["", f"## {e.exercise}: {e.status}", "", "```", e.output or "(nothing)",
                      "```"]
        return "\n".join(lines) + "\n"


def _graded(count: int) -> str:
    return f"{count} exercise{'s' if count != 1 else ''} graded"


def write_submission(grade: SubmissionGrade, folder: Path) -> None:
    """``folder/results.json`` and ``folder/report.md``."""
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    write_results_json(grade, folder / "results.json")
    (folder / "report.md").write_text(grade.report_md(), encoding="utf-8")


def write_results_json(grade: SubmissionGrade, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(grade.results_json(), indent=2) + "\n", encoding="utf-8")
