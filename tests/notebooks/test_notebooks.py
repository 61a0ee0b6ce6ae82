"""The course notebooks: each runs headless in a real kernel, and each is committed clean."""

from __future__ import annotations

import json
from pathlib import Path

import nbformat
import pytest

from ddp_lab.tools.notebook_runner import execute_notebook, find_notebooks
from ddp_lab.tools.solved import exercise_cells

NOTEBOOK_DIR = Path(__file__).resolve().parents[2] / "notebooks"
NOTEBOOKS = find_notebooks(NOTEBOOK_DIR)


def _params() -> list:
    """One case per notebook, or a single skipped case while the course has none."""
    if not NOTEBOOKS:
        reason = f"no notebooks in {NOTEBOOK_DIR} yet"
        return [pytest.param(None, id="no-notebooks", marks=pytest.mark.skip(reason=reason))]
    return [pytest.param(path, id=path.stem) for path in NOTEBOOKS]


@pytest.mark.timeout(600)  # a hang guard, not a speed target (busy cores)
@pytest.mark.parametrize("notebook", _params())
def test_notebook_runs_headless(notebook: Path, tmp_path: Path):
    report = execute_notebook(notebook, tmp_path, timeout_per_cell=240)
    assert report.ok, (
        f"{report.describe()}\n"
        f"executed copy: {report.executed_path}\nHTML with the traceback: {report.html_path}\n"
        f"reproduce: ddp-lab notebooks --pattern {notebook.name}\n"
        f"what the cells printed last:\n{report.printed_tail()}"
    )
    executed = nbformat.read(report.executed_path, as_version=4)
    images = [o for c in executed.cells if c.cell_type == "code" for o in c.outputs
              if "image/png" in o.get("data", {})]
    assert images, f"{notebook.name} drew no figure: each notebook shows its real results"


@pytest.mark.timeout(60)
@pytest.mark.parametrize("notebook", _params())
def test_notebook_is_committed_clean(notebook: Path):
    """DESIGN.md rule 6: no outputs or execution counts in git, and a valid nbformat file
    whose every cell has an id (nbformat 4.5 requires them; without, a warning today)."""
    raw = json.loads(notebook.read_text())
    no_id = [number for number, cell in enumerate(raw["cells"]) if "id" not in cell]
    assert not no_id, f"{notebook.name}: cells {no_id} have no id; nbformat.normalize() adds them"
    nb = nbformat.read(notebook, as_version=4)
    nbformat.validate(nb)
    dirty = [
        number
        for number, cell in enumerate((c for c in nb.cells if c.cell_type == "code"), 1)
        if cell.outputs or cell.execution_count is not None
    ]
    assert not dirty, (
        f"{notebook.name}: code cells {dirty} have outputs or execution counts; clear them "
        f"with `jupyter nbconvert --clear-output --inplace {notebook.name}` before committing"
    )


SOLVABLE = [p for p in NOTEBOOKS if exercise_cells(nbformat.read(p, as_version=4))]


@pytest.mark.timeout(600)  # a hang guard, not a speed target (busy cores)
@pytest.mark.parametrize("notebook", [pytest.param(p, id=p.stem) for p in SOLVABLE])
def test_notebook_passes_every_check_when_solved(notebook: Path, tmp_path: Path):
    """Solved mode (``ddp-lab notebooks --solved``): each exercise cell holds its reference
    solution, and no check may say "not solved yet" (the runner fails the notebook)."""
    report = execute_notebook(notebook, tmp_path, timeout_per_cell=240, solved=True)
    assert report.ok, (f"{report.describe()}\nHTML with the traceback: {report.html_path}\n"
                       f"reproduce: ddp-lab notebooks --solved --pattern {notebook.name}\n"
                       f"what the cells printed last:\n{report.printed_tail()}")
    executed = nbformat.read(report.executed_path, as_version=4)
    checks = [c for c in executed.cells if c.cell_type == "code" and "ex.check(" in c.source]
    passed = [c for c in checks if any(": passed." in o.get("text", "") for o in c.outputs)]
    assert checks and len(passed) >= len(exercise_cells(executed)), [c.source for c in checks]
