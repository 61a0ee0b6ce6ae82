"""``ddp-lab assign``: the course exported to the grading tools courses already use.

- ``nbgrader``: source notebooks in nbgrader's course layout (nbgrader_export);
- ``otter``: Otter-Grader master notebooks for ``otter assign`` (otter_export);
- ``gradescope``: an autograder.zip whose ``run_autograder`` calls ``ddp-lab grade``
  (gradescope_export).

Points and visibility come from the registry (``Exercise.points``, ``Exercise.visibility``),
nowhere else; the solutions from the reference solutions, as ``ddp-lab notebooks --solved``
runs them. docs/assign.md is the instructor's page.
"""

from __future__ import annotations

from pathlib import Path

FORMATS = ("nbgrader", "otter", "gradescope")


def export(fmt: str, notebook_dir: Path, out: Path, pattern: str = "*.ipynb") -> list[Path]:
    """Write format ``fmt``'s files for the course notebooks under ``out``; return them."""
    if fmt not in FORMATS:
        raise ValueError(f"unknown format {fmt!r}: choose one of {', '.join(FORMATS)}")
    if fmt == "gradescope":
        from ddp_lab.grading.export import gradescope_export
        return [gradescope_export.write(out, Path(notebook_dir))]
    from ddp_lab.grading.export.course_cells import course_notebooks
    courses = course_notebooks(Path(notebook_dir), pattern)
    if fmt == "nbgrader":
        from ddp_lab.grading.export import nbgrader_export
        return nbgrader_export.write(courses, out)
    from ddp_lab.grading.export import otter_export
    return otter_export.write(courses, out)
