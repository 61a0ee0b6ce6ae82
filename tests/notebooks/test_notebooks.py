"""The course notebooks: each runs headless in a real kernel, and each is committed clean.

Each notebook runs once, as a learner gets it (stubs in the exercise cells); notebook 00 runs
in JupyterLab instead where the browser test runs (test_browser.py's Run All). Solved mode
(``ddp-lab notebooks --solved``) only adds that each reference solution, pasted into its
cell, passes its check: tests/exercises/test_notebook_cells.py shows that per exercise
without a kernel, and tests/notebooks/test_notebook_runner.py the swap itself."""

from __future__ import annotations

import json
from pathlib import Path

import nbformat
import pytest

import browser_helpers as lab_ui
from ddp_lab.tools.notebook_runner import execute_notebook, find_notebooks

NOTEBOOK_DIR = Path(__file__).resolve().parents[2] / "notebooks"
NOTEBOOKS = find_notebooks(NOTEBOOK_DIR)
# test_browser.py runs this notebook with JupyterLab's Run All and judges what this test
# judges (no cell raised, a figure drawn); where it runs, the notebook is not run twice.
RUN_ALL_IN_BROWSER = (lab_ui.NOTEBOOK_00, "test_browser.py::test_run_all_cells_of_notebook_00")


def _params() -> list:
    """One case per notebook, or a single skipped case while the course has none."""
    if not NOTEBOOKS:
        reason = f"no notebooks in {NOTEBOOK_DIR} yet"
        return [pytest.param(None, id="no-notebooks", marks=pytest.mark.skip(reason=reason))]
    return [pytest.param(path, id=path.stem) for path in NOTEBOOKS]


@pytest.mark.notebooks
@pytest.mark.timeout(600)  # a hang guard, not a speed target (busy cores)
@pytest.mark.parametrize("notebook", _params())
def test_notebook_runs_headless(notebook: Path, tmp_path: Path, request):
    if _run_all_in_browser(notebook, request.session):
        pytest.skip(f"{RUN_ALL_IN_BROWSER[1]} runs it in JupyterLab in this session")
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


def _run_all_in_browser(notebook: Path, session) -> bool:
    """Whether the browser's Run All of this notebook is selected and can run here."""
    name, test = RUN_ALL_IN_BROWSER
    if notebook.name != name:
        return False
    runs = not lab_ui.missing_requirements() or lab_ui.IN_CI  # in CI, a missing browser fails
    return runs and any(item.nodeid.endswith(test) for item in session.items)


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



# What starts a process, a store or a listener outside ddp_lab's launchers, whose runs each
# live in a private network (README, "Who can reach a run"): torchrun's store listens on
# every interface and unpickles what it holds, a store or socket opened in the kernel sits
# in the machine's namespace. A notebook reaches them through ddp_lab (run, run_script,
# launch/torchrun/command.torchrun, run_agents), never by itself.
STARTS_ITS_OWN = ("subprocess", "Popen", "os.system", "torch.distributed.run",
                  "elastic_launch(", "TCPStore(", "socket.socket", ".listen(")


@pytest.mark.timeout(60)
@pytest.mark.parametrize("notebook", _params())
def test_no_cell_starts_a_process_a_store_or_a_listener_itself(notebook: Path):
    nb = nbformat.read(notebook, as_version=4)
    found = [(number, text) for number, cell in enumerate(nb.cells)
             if cell.cell_type == "code" for text in STARTS_ITS_OWN if text in cell.source]
    assert not found, f"{notebook.name}: cells start their own processes or ports: {found}"
