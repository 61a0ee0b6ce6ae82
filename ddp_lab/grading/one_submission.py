"""Grading one submission: its notebooks run in a sandboxed kernel (harvest.py) that leaves
one payload per exercise, then the payloads checked in a second sandboxed process
(checking.py), each step in a private temporary folder of its own that is removed after.

What the grade trusts: the submission's notebook source (read here, never run here), the
payload files' bytes (handed on, never unpickled here), and the checking process's signed
result lines. Nothing else the sandboxes wrote counts for a score.
"""

from __future__ import annotations

import json
import os
import secrets
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import nbformat

from ddp_lab.grading import results as r
from ddp_lab.grading.checking import read_results
from ddp_lab.grading.harvest import ERRORS_MARK, LEFT_MARK
from ddp_lab.grading.sandbox import run_sandboxed
from ddp_lab.grading.kernel_cells import PAYLOAD_SUFFIX, kernel_notebook
from ddp_lab.grading.submission import Submission
from ddp_lab.tools.notebook_runner import kernel_env

GIB = 1 << 30
PAYLOAD_BYTES = 64 << 20  # a function with its globals; a larger file is not one
LEFT_NOTED = 16  # processes a kernel left running before the grade says so


@dataclass(frozen=True)
class Budgets:
    """What one submission may use. ``cell_s``: one cell of its kernel; ``kernel_s``: its
    kernels in all, per notebook; ``check_s``: per exercise, on top of ``start_s`` for the
    checking process to start."""

    cell_s: float = 60.0
    kernel_s: float = 240.0
    check_s: float = 120.0
    start_s: float = 60.0
    memory_bytes: int = 8 * GIB
    max_processes: int = 1024

    def __post_init__(self):
        for name in ("cell_s", "kernel_s", "check_s", "start_s", "memory_bytes",
                     "max_processes"):
            if not getattr(self, name) > 0:
                raise ValueError(f"the grading budget {name} must be positive, got "
                                 f"{getattr(self, name)!r}")


def grade_submission(submission: Submission, budgets: Budgets,
                     hidden: tuple[Path, ...] = ()) -> r.SubmissionGrade:
    """Run and check every exercise of ``submission``; never raises for what the
    submission does. ``hidden``: paths its sandboxes must not show (every submission of
    the class, the grades)."""
    started = time.perf_counter()
    grade = r.SubmissionGrade(name=submission.name, source=str(submission.path.resolve()))
    grade.notes += [reject.reason for reject in submission.rejected]
    exercises = submission.exercises()
    attempted = {name: nb for name, nb in exercises.items() if not nb.is_stub(name)}
    with tempfile.TemporaryDirectory(prefix="ddp-lab-grade-") as work:
        sandbox = _Sandbox(budgets, tuple(hidden))
        payloads, said = _harvest(submission, Path(work), sandbox, budgets.cell_s, grade.notes)
        functions = {name: nb.functions[name] for name, nb in exercises.items()}
        outcomes = _check({e: p for e, p in payloads.items() if e in attempted}, functions,
                          Path(work), sandbox, grade.notes)
    for name, nb in exercises.items():
        grade.exercises.append(_exercise_grade(name, nb, attempted, payloads, outcomes,
                                               said))
    grade.seconds = time.perf_counter() - started
    return grade


def _exercise_grade(name, nb, attempted, payloads, outcomes, said) -> r.ExerciseGrade:
    function = nb.functions[name]
    if name not in attempted:
        return r.ExerciseGrade(name, r.NOT_ATTEMPTED, "the exercise cell is the stub as "
                                                      "shipped")
    if name not in payloads:
        why = said.get(name, "")
        return r.ExerciseGrade(name, r.MISSING, f"no function {function} in the notebook"
                                                f"{f' ({why})' if why else ''}")
    outcome = outcomes.get(name)
    if outcome is None:
        return r.ExerciseGrade(name, r.NOT_CHECKED, "the checking process stopped before "
                                                    "this exercise's result")
    return r.ExerciseGrade(name, outcome.status, outcome.output)


@dataclass(frozen=True)
class _Sandbox:
    """``run_sandboxed`` with the budgets and the hidden paths (every submission of the
    class and the grades: no submission reads another); the wall-clock budget is given per
    step."""

    budgets: Budgets
    hidden: tuple[Path, ...]

    def run(self, argv: list[str], folder: Path, wall_s: float):
        return run_sandboxed(argv, folder, wall_s=wall_s,
                             memory_bytes=self.budgets.memory_bytes,
                             max_processes=self.budgets.max_processes,
                             env=sandbox_env(folder), hidden=self.hidden)


def _harvest(submission, work: Path, sandbox: _Sandbox, cell_s: float, notes: list[str]):
    """Run the kernels; return ({exercise: payload bytes}, {exercise: its cell's error})."""
    folder = _private(work / "kernel")
    names = []
    for nb in submission.notebooks:
        names.append(f"{nb.name}.ipynb")
        nbformat.write(kernel_notebook(nb), folder / names[-1])
    if not names:
        return {}, {}
    argv = [sys.executable, "-m", "ddp_lab.grading.harvest", f"{cell_s:g}", *names]
    ran = sandbox.run(argv, folder, sandbox.budgets.kernel_s * len(names))
    _note(ran, "the notebook's kernel", notes)
    _note_left(ran.stdout, notes)
    wanted = {e for nb in submission.notebooks for e in nb.functions}
    return _payloads(folder, wanted), _cell_errors(ran.stdout, submission)


def _payloads(folder: Path, wanted: set[str]) -> dict[str, bytes]:
    """The payload files the kernel left: regular files only (a link is not followed),
    bounded in size."""
    found = {}
    for exercise in wanted:
        data = _read_regular(folder / f"{exercise}{PAYLOAD_SUFFIX}")
        if data:
            found[exercise] = data
    return found


def _read_regular(path: Path) -> bytes:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return b""
    with os.fdopen(fd, "rb") as f:
        if not os.path.isfile(f"/proc/self/fd/{fd}") or os.fstat(fd).st_size > PAYLOAD_BYTES:
            return b""
        return f.read(PAYLOAD_BYTES + 1)[:PAYLOAD_BYTES]


def _cell_errors(stdout: str, submission: Submission) -> dict[str, str]:
    """What each exercise's cell raised, by exercise (words to quote, nothing more)."""
    found = {}
    for line in stdout.splitlines():
        if not line.startswith(ERRORS_MARK):
            continue
        try:
            said = json.loads(line[len(ERRORS_MARK):])
            errors = {int(i): str(e)[:300] for i, e in said["errors"].items()}
        except (ValueError, KeyError, TypeError, AttributeError):
            continue
        nb = next((n for n in submission.notebooks if f"{n.name}.ipynb" == said["notebook"]),
                  None)
        if nb is not None:
            found.update(_by_exercise(nb, errors))
    return found


def _by_exercise(nb, errors: dict[int, str]) -> dict[str, str]:
    """Why each exercise's function may be missing, from the kernel's cell errors: what its
    own cell raised, else what the cell that saves it raised (a kernel its cell wedged),
    else the first error of a cell before it (an import that timed out), else the kernel's
    end (harvest.py files that under -1)."""
    found, before, cells = {}, "", kernel_notebook(nb).cells
    for index, cell in enumerate(cells):
        exercise = cell.metadata.get("exercise")
        if exercise is None:
            before = before or _quoted("a cell before it", errors.get(index))
            continue
        found[exercise] = (_quoted("its cell", errors.get(index))
                           or _quoted("the cell that saves it", errors.get(index + 1))
                           or before or errors.get(-1, ""))
    return {exercise: why for exercise, why in found.items() if why}


def _quoted(which: str, error: str | None) -> str:
    return f"{which} raised {error}" if error else ""


def _check(payloads: dict[str, bytes], functions: dict[str, str], work: Path,
           sandbox: _Sandbox, notes: list[str]):
    """Check the payloads in the second sandbox; the verified outcomes by exercise."""
    if not payloads:
        return {}
    folder = _private(work / "check")
    key = secrets.token_bytes(32)
    (folder / "key").write_text(key.hex())
    job = []
    for exercise, data in payloads.items():
        (folder / f"{exercise}{PAYLOAD_SUFFIX}").write_bytes(data)
        job.append({"exercise": exercise, "payload": f"{exercise}{PAYLOAD_SUFFIX}",
                    "function": functions[exercise]})
    (folder / "job.json").write_text(json.dumps({"exercises": job}))
    budgets = sandbox.budgets
    ran = sandbox.run([sys.executable, "-m", "ddp_lab.grading.checking"], folder,
                  budgets.start_s + budgets.check_s * len(job))
    _note(ran, "the checking process", notes)
    return read_results(ran.stdout, key)


def _note(ran, what: str, notes: list[str]) -> None:
    """Why a sandboxed step did not end well, in a line of the grade's notes."""
    if ran.reason:
        notes.append(f"{what} {ran.reason}")
    elif ran.returncode != 0:
        last = (ran.stderr.strip().splitlines() or ["(nothing on stderr)"])[-1][:300]
        notes.append(f"{what} ended with exit code {ran.returncode}: {last}")


def _note_left(stdout: str, notes: list[str]) -> None:
    """A kernel that left many processes running (a fork bomb whose cell ran out of time
    first): say so, whatever else its notebook said. A few are let be (a fork server on
    its way out)."""
    counts = [line[len(LEFT_MARK):] for line in stdout.splitlines() if line.startswith(LEFT_MARK)]
    left = int(counts[-1]) if counts and counts[-1].strip().isdigit() else 0
    if left >= LEFT_NOTED:
        notes.append(f"the notebook's kernel left {left} processes running (stopped with its "
                     "sandbox): a cell forked them and never waited for them")


def _private(folder: Path) -> Path:
    folder.mkdir(mode=0o700)
    return folder


def sandbox_env(folder: Path) -> dict[str, str]:
    """The sandboxed processes' environment: the kernel's (this ddp_lab on PYTHONPATH), a
    home in their own folder, and nothing of the grader's own secrets or settings."""
    keep = {k: v for k, v in kernel_env().items()
            if k in ("PATH", "LANG", "LC_ALL", "PYTHONPATH", "MPLBACKEND",
                     "PYDEVD_DISABLE_FILE_VALIDATION", "DDP_LAB_ISOLATION")}
    return dict(keep, HOME=str(folder), PYTHONDONTWRITEBYTECODE="1",
                MPLCONFIGDIR=str(folder / ".matplotlib"), IPYTHONDIR=str(folder / ".ipython"))

