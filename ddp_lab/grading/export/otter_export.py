"""The course as Otter-Grader master notebooks (Otter Assign's format, Otter 7):
``OUT/<notebook>/<notebook>.ipynb`` with its ``requirements.txt``, ready for
``otter assign OUT/<notebook>/<notebook>.ipynb DIST`` (https://otter-grader.readthedocs.io/).

Each exercise becomes a question: a ``# BEGIN QUESTION`` raw cell (name, the registry's
points), the stub cell with the reference solution between ``# BEGIN SOLUTION NO PROMPT`` /
``# END SOLUTION`` (Otter strips it, leaving the course's stub), a test cell that runs the
checker strictly (in_kernel; hidden unless the registry says "visible"), ``# END QUESTION``;
the course's own check cell follows, as in ``notebooks/``. Otter's init, check and export
cells are off: they import otter in the learner's kernel, which the course does not install.
"""

from __future__ import annotations

import copy
from pathlib import Path

import nbformat

from ddp_lab.grading.export.course_cells import (CourseNotebook, ExerciseCells, check_call,
                                                 with_solution)
from ddp_lab.tools.solved import cell_source

# What the autograder's image installs: the course (and torch, CPU build) and nothing else.
REQUIREMENTS = "--extra-index-url https://download.pytorch.org/whl/cpu\ntorch\nddp-lab\n"


def write(courses: list[CourseNotebook], out: Path) -> list[Path]:
    """One folder per course notebook under ``out``; return the master notebooks."""
    written = []
    for course in courses:
        folder = out / course.assignment
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "requirements.txt").write_text(REQUIREMENTS)
        target = folder / course.path.name
        nbformat.write(master_notebook(course), target)
        written.append(target)
    return written


def master_notebook(course: CourseNotebook) -> nbformat.NotebookNode:
    nb = copy.deepcopy(course.notebook)
    by_stub = {item.stub_index: item for item in course.exercises}
    cells = [_raw(_assignment_config(course))]
    for index, cell in enumerate(nb.cells):
        item = by_stub.get(index)
        cells.extend(_question(cell, item) if item else [cell])
    nb.cells = cells
    return nb


def _assignment_config(course: CourseNotebook) -> str:
    return "\n".join([
        "# ASSIGNMENT CONFIG", f"name: {course.assignment}", "requirements: requirements.txt",
        "init_cell: false", "check_all_cell: false", "export_cell: false",
        # The tests run the course's checkers on real ranks: a grading run, not assign's job.
        "run_tests: false"])


def _question(cell, item: ExerciseCells) -> list:
    exercise = item.exercise
    solved = copy.deepcopy(cell)
    solved.source = with_solution(cell_source(cell), exercise.name,
                                  "# BEGIN SOLUTION NO PROMPT", "# END SOLUTION")
    config = "\n".join(["# BEGIN QUESTION", f"name: {item.slug}", f"points: {exercise.points}",
                        "check_cell: false"])
    hidden = "true" if exercise.visibility != "visible" else "false"
    test = (f'""" # BEGIN TEST CONFIG\nhidden: {hidden}\n""" # END TEST CONFIG\n'
            f"{check_call(item)}")
    return [_raw(config), _raw("# BEGIN SOLUTION"), solved, _raw("# END SOLUTION"),
            _raw("# BEGIN TESTS"), nbformat.v4.new_code_cell(test), _raw("# END TESTS"),
            _raw("# END QUESTION")]


def _raw(text: str):
    return nbformat.v4.new_raw_cell(text)
