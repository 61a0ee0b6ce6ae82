"""What a submission holds: its course notebooks, which notebook each one is, and for each of
its exercises the function the kernel must hand over (the name the shipped stub defines).

A submission is a notebook as a learner saved it, or a folder of them (searched
recursively, Jupyter's checkpoint copies skipped). A notebook is known by the exercises its
tagged cells name in their metadata, else by its file name's ``NN_`` or ``NNb_`` prefix; one
that does not parse, or is no course notebook, is a :class:`Rejected` with the reason. Pure
functions: nothing here runs the learner's code.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

import nbformat

from ddp_lab.exercises.registry import all_exercises
from ddp_lab.exercises.stubs import is_stub_source
from ddp_lab.tools.notebook_runner import find_notebooks
from ddp_lab.tools.solved import cell_source, defined_name, exercise_cells

COURSE_DIR = Path(__file__).resolve().parents[2] / "notebooks"


@dataclass(frozen=True)
class Rejected:
    """A file of the submission that cannot be graded, and why (a clear zero)."""

    path: Path
    reason: str


@dataclass(frozen=True)
class CourseNotebook:
    """One course notebook of a submission: its course name (``02_point_to_point``), the
    notebook as saved, and per exercise the function name its kernel must define."""

    path: Path
    name: str
    nb: nbformat.NotebookNode
    functions: dict[str, str]  # exercise -> the name the shipped stub cell defines

    def exercise_cell(self, exercise: str) -> str | None:
        """The source of the cell tagged for ``exercise``, or None when it was deleted."""
        for index, named in exercise_cells(self.nb):
            if named == exercise:
                return cell_source(self.nb.cells[index])
        return None

    def is_stub(self, exercise: str) -> bool:
        """Whether the exercise's cell is still the stub as shipped (not attempted)."""
        source = self.exercise_cell(exercise)
        return source is not None and is_stub_source(source)


@dataclass
class Submission:
    """A submission: a name for its results folder, its course notebooks, its rejects."""

    name: str
    path: Path
    notebooks: list[CourseNotebook] = field(default_factory=list)
    rejected: list[Rejected] = field(default_factory=list)

    def exercises(self) -> dict[str, CourseNotebook]:
        """Every exercise of its notebooks, in course order, with the notebook it is in."""
        found = {name: nb for nb in self.notebooks for name in nb.functions}
        return {name: found[name] for name in all_exercises() if name in found}


def read_submission(path: Path | str, name: str, course_dir: Path = COURSE_DIR) -> Submission:
    """The submission at ``path`` (a notebook or a folder of them), named ``name``."""
    path = Path(path)
    submission = Submission(name=name, path=path)
    files = [path] if path.is_file() else find_notebooks_within(path)
    if not files:
        submission.rejected.append(Rejected(path, "no notebook (.ipynb) in the submission"))
    stubs = course_functions(course_dir)
    for file in files:
        found = read_notebook(file, stubs)
        if isinstance(found, CourseNotebook):
            found = _first_copy(found, submission.notebooks)
        target = submission.rejected if isinstance(found, Rejected) else submission.notebooks
        target.append(found)
    return submission


def _first_copy(nb: CourseNotebook, kept: list[CourseNotebook]) -> CourseNotebook | Rejected:
    """``nb``, or a reject when the submission already holds that course notebook (a
    saved copy beside the original): the first in path order is the one graded."""
    earlier = next((k for k in kept if k.name == nb.name), None)
    if earlier is None:
        return nb
    return Rejected(nb.path, f"{nb.path.name} is a second copy of {nb.name}: only "
                             f"{earlier.path.name} is graded")


def find_notebooks_within(folder: Path) -> list[Path]:
    """Every notebook under ``folder``, recursively, in path order."""
    return sorted({p for p in find_notebooks(folder, "**/*.ipynb")})


def read_notebook(path: Path, stubs: dict[str, dict[str, str]]) -> CourseNotebook | Rejected:
    """``path`` as a course notebook, or why it is not one."""
    try:
        nb = nbformat.read(path, as_version=4)
    except Exception as exc:  # noqa: BLE001 - any unreadable file is a reason, not a crash
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        return Rejected(path, f"{path.name} is not a readable notebook ({first[:200]})")
    name = identify(path, nb, stubs)
    if name is None:
        return Rejected(path, f"{path.name} is not a course notebook: no exercise cell names "
                              f"a course exercise and its name starts with no course "
                              f"notebook's number")
    return CourseNotebook(path=path, name=name, nb=nb, functions=stubs[name])


def identify(path: Path, nb, stubs: dict[str, dict[str, str]]) -> str | None:
    """Which course notebook ``nb`` is: the one its tagged cells' exercises belong to, else
    the one whose number (``02``, ``03b``) starts the file's name."""
    exercises = all_exercises()
    named = {exercises[e].notebook for _, e in _tagged(nb) if e in exercises}
    if len(named) == 1:
        return named.pop()
    number = re.match(r"(\d\d[a-z]?)_", path.name)
    matches = [n for n in stubs if number and n.split("_", 1)[0] == number.group(1)]
    return matches[0] if len(matches) == 1 else None


def _tagged(nb) -> list[tuple[int, str]]:
    try:
        return exercise_cells(nb)
    except (KeyError, TypeError, AttributeError):
        return []


def course_functions(course_dir: Path = COURSE_DIR) -> dict[str, dict[str, str]]:
    """Per shipped notebook that has exercises: exercise -> the name its stub defines."""
    if not course_dir.is_dir():
        raise FileNotFoundError(f"no course notebooks in {course_dir}: pass --course with "
                                f"the folder of the shipped notebooks (the repo's notebooks/)")
    found = {}
    for path in find_notebooks(course_dir):
        nb = nbformat.read(path, as_version=4)
        functions = {name: defined_name(cell_source(nb.cells[i]))
                     for i, name in exercise_cells(nb)}
        if functions:
            found[path.stem] = functions
    return found
