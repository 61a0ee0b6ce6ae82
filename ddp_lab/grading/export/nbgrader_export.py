"""The course as nbgrader source notebooks, in nbgrader's course layout:
``OUT/nbgrader_config.py`` and ``OUT/source/<notebook>/<notebook>.ipynb``, one assignment
per course notebook.

In each: the exercise cell is a solution cell (the stub, then the reference solution between
``### BEGIN SOLUTION`` / ``### END SOLUTION``), its check cell an autograded test cell worth
the registry's points whose hidden part runs the checker strictly (in_kernel), every other
cell locked read-only. Then ``nbgrader generate_assignment NB`` releases the stubs and
``nbgrader autograde NB`` grades (https://nbgrader.readthedocs.io/en/stable/).
"""

from __future__ import annotations

import copy
from pathlib import Path

import nbformat

from ddp_lab.grading.export.course_cells import (CourseNotebook, ExerciseCells, check_call,
                                                 with_solution)
from ddp_lab.tools.solved import cell_source

SCHEMA_VERSION = 3  # nbgrader 0.9's cell metadata schema
# What replaces the solution in the learner's copy: the stub above it stays, so the cell
# must still run (nbgrader's default stub raises NotImplementedError at the top level).
CODE_STUB = "# YOUR CODE HERE: write the function above (the check cell below tests it)"
CELL_TIMEOUT_S = 600  # nbgrader's default is 30 s a cell; a course cell may run ranks longer

CONFIG = f'''\
# nbgrader's configuration for the ddp-lab course, written by `ddp-lab assign --format nbgrader`.
c = get_config()  # noqa: F821 (nbgrader defines it)
c.CourseDirectory.root = __file__.rsplit("/", 1)[0]
c.ClearSolutions.code_stub = {{"python": {CODE_STUB!r}}}
c.Execute.timeout = {CELL_TIMEOUT_S}
'''


def write(courses: list[CourseNotebook], out: Path) -> list[Path]:
    """Write the course layout under ``out``; return the notebooks written."""
    out.mkdir(parents=True, exist_ok=True)
    (out / "nbgrader_config.py").write_text(CONFIG)
    written = []
    for course in courses:
        target = out / "source" / course.assignment / course.path.name
        target.parent.mkdir(parents=True, exist_ok=True)
        nbformat.write(source_notebook(course), target)
        written.append(target)
    return written


def source_notebook(course: CourseNotebook) -> nbformat.NotebookNode:
    """The course notebook with nbgrader's metadata and markers on every cell."""
    nb = copy.deepcopy(course.notebook)
    by_cell = {}
    for item in course.exercises:
        by_cell[item.stub_index] = (_solution_cell, item)
        by_cell[item.check_index] = (_test_cell, item)
    for index, cell in enumerate(nb.cells):
        make, item = by_cell.get(index, (None, None))
        if make is None:
            _mark(cell, f"cell-{index:03d}", locked=True)
        else:
            make(cell, item)
    return nb


def _solution_cell(cell, item: ExerciseCells) -> None:
    cell.source = with_solution(cell_source(cell), item.exercise.name,
                                "### BEGIN SOLUTION", "### END SOLUTION")
    _mark(cell, item.slug, solution=True)


def _test_cell(cell, item: ExerciseCells) -> None:
    hidden = f"### BEGIN HIDDEN TESTS\n{check_call(item)}\n### END HIDDEN TESTS\n"
    cell.source = f"{cell_source(cell).rstrip()}\n{hidden}"
    _mark(cell, f"{item.slug}-check", grade=True, locked=True, points=item.exercise.points)


def _mark(cell, grade_id: str, *, grade=False, solution=False, locked=False,
          points=None) -> None:
    meta = {"grade": grade, "solution": solution, "locked": locked, "grade_id": grade_id,
            "schema_version": SCHEMA_VERSION}
    if points is not None:
        meta["points"] = points
    cell.metadata["nbgrader"] = meta
