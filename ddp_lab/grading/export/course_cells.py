"""What every export reads from a course notebook: its exercises, each one's stub cell and
graded check cell, and the stub cell with the reference solution added between a grading
tool's markers.

The solution goes *after* the stub, bound to the stub's name (``ddp_lab/tools/solved.py``
builds it, as ``ddp-lab notebooks --solved`` runs it), so the instructor's notebook is the
solved one, and what a tool strips from the release leaves the course's own stub cell: the
learner sees the same cell as in ``notebooks/``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import nbformat

from ddp_lab.exercises.registry import Exercise, find
from ddp_lab.tools.notebook_runner import find_notebooks
from ddp_lab.tools.solved import cell_source, defined_name, exercise_cells, solution_source


@dataclass(frozen=True)
class ExerciseCells:
    """One exercise of a notebook: its stub cell, its check cell, the stub's entry point."""

    exercise: Exercise
    stub_index: int
    check_index: int
    function: str  # the name the stub cell defines, which the check cell hands ex.check

    @property
    def slug(self) -> str:
        """The exercise's name as an identifier: tools want [A-Za-z0-9_] in ids and file names."""
        return "ex_" + re.sub(r"\W", "_", self.exercise.name)


@dataclass(frozen=True)
class CourseNotebook:
    path: Path
    notebook: nbformat.NotebookNode
    exercises: tuple[ExerciseCells, ...]

    @property
    def assignment(self) -> str:
        """The assignment's name in a grading tool: the notebook's file name, less .ipynb."""
        return self.path.stem


def course_notebooks(notebook_dir: Path, pattern: str = "*.ipynb") -> list[CourseNotebook]:
    """The course notebooks in ``notebook_dir`` matching ``pattern`` that hold exercises."""
    found = [read_notebook(path) for path in find_notebooks(notebook_dir, pattern)]
    chosen = [course for course in found if course.exercises]
    if not chosen:
        raise ValueError(f"no course notebook with exercises matches {pattern!r} in "
                         f"{notebook_dir}/; pass --dir (the course's notebooks/ folder) and "
                         "a --pattern such as '02*'")
    return chosen


def read_notebook(path: Path) -> CourseNotebook:
    nb = nbformat.read(path, as_version=4)
    cells = tuple(_exercise(nb, path, index, name) for index, name in exercise_cells(nb))
    return CourseNotebook(path, nb, cells)


def _exercise(nb, path: Path, stub_index: int, name: str) -> ExerciseCells:
    function = defined_name(cell_source(nb.cells[stub_index]))
    call = re.compile(rf"ex\.check\(\s*['\"]{re.escape(name)}['\"]\s*,\s*{function}\s*\)")
    for index in range(stub_index + 1, len(nb.cells)):
        cell = nb.cells[index]
        if cell.cell_type == "code" and call.search(cell_source(cell)):
            return ExerciseCells(find(name), stub_index, index, function)
    raise ValueError(f"{path.name}: exercise {name!r} (cell {stub_index}) has no check cell "
                     f"after it calling ex.check({name!r}, {function})")


def with_solution(stub_source: str, name: str, begin: str, end: str) -> str:
    """The stub cell, then the reference solution bound to the stub's name between the
    ``begin`` and ``end`` marker lines (which the tool strips from the learner's copy)."""
    solution = solution_source(name, defined_name(stub_source)).rstrip("\n")
    return f"{stub_source.rstrip()}\n\n\n{begin}\n{solution}\n{end}\n"


def check_call(item: ExerciseCells) -> str:
    """The hidden check a grading tool runs in the submission's kernel (see in_kernel)."""
    return ("from ddp_lab.grading.export.in_kernel import require_pass\n"
            f"require_pass({item.exercise.name!r}, {item.function})")
