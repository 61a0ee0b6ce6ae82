"""The course as a learner meets it: JupyterLab in a real Chromium, driven by Playwright.

Run All on notebook 00 must finish with no error and a rendered figure, and the toolbar's
stop button must stop every rank of a running launch. Skipped on a machine without
Chromium or playwright, unless CI=true: there it fails, since .ci/run installs both.
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import nbformat
import psutil
import pytest

import browser_helpers as lab_ui
from conftest import wait_until_gone

pytestmark = pytest.mark.browser

MISSING = lab_ui.missing_requirements()
if MISSING and not lab_ui.IN_CI:
    pytest.skip(f"browser test needs {' and '.join(MISSING)}; with CI=true this fails instead",
                allow_module_level=True)

NOTEBOOK_00 = lab_ui.NOTEBOOK_00
SCREENSHOT = lab_ui.ROOT / "build" / "test-artifacts" / "jupyterlab_00.png"


@pytest.fixture
def lab(tmp_path: Path):
    """jupyter lab over a scratch copy of notebooks/ (Run All rewrites the file it saves)."""
    root = tmp_path / "notebooks"
    shutil.copytree(lab_ui.ROOT / "notebooks", root,
                    ignore=shutil.ignore_patterns(".ipynb_checkpoints"))
    (tmp_path / "home").mkdir()
    server = lab_ui.start_lab(root, tmp_path / "home")
    yield server
    leftovers = lab_ui.stop_lab(server)
    assert not leftovers, f"processes outlived jupyter lab (now killed): {leftovers}"


@pytest.fixture
def page():
    """A Chromium tab; browser and Playwright's driver are closed before conftest's
    nothing_left_behind check, which would otherwise count them as leftovers."""
    assert not MISSING, f"CI=true but the browser test lacks {MISSING}: see .ci/run"
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        # --no-sandbox: Chromium refuses to start as root (CI) with its sandbox on; the
        # browser only ever visits this test's own loopback server.
        browser = playwright.chromium.launch(headless=True, executable_path=str(lab_ui.CHROMIUM),
                                             args=["--no-sandbox"])
        try:
            tab = browser.new_page(viewport={"width": 1280, "height": 900})
            tab.set_default_timeout(60_000)
            yield tab
        finally:
            browser.close()


@pytest.mark.timeout(300)
def test_run_all_cells_of_notebook_00(lab, page):
    lab_ui.open_notebook(page, lab, NOTEBOOK_00)
    lab_ui.run_all(page, timeout_s=240)
    lab_ui.save(page)

    # Errors are judged on the saved notebook, not the DOM: an error output and a stderr
    # stream render alike (both application/vnd.jupyter.stderr), doctor's warnings are
    # legit stderr, and cells 17 and 20 print caught WorkerError/WorkerTimeout messages
    # that contain tracebacks on purpose. The saved file says output_type "error" only
    # for an exception that escaped a cell.
    saved = nbformat.read(lab.root / NOTEBOOK_00, as_version=4)
    code = [c for c in saved.cells if c.cell_type == "code"]
    errors = [f"cell {n}: {o.ename}: {o.evalue}" for n, c in enumerate(code, 1)
              for o in c.outputs if o.output_type == "error"]
    assert not errors, f"cells raised in JupyterLab: {errors}"
    not_run = [n for n, c in enumerate(code, 1) if c.execution_count is None]
    assert not not_run, f"code cells never run (Run All stopped early?): {not_run}"
    assert all(re.fullmatch(r"\[\d+\]:", p) for p in lab_ui.prompts(page)), lab_ui.prompts(page)

    page.wait_for_function(
        "[...document.querySelectorAll('.jp-RenderedImage img')].some(i => i.naturalWidth > 0)",
        timeout=30_000)
    lab_ui.screenshot_whole_notebook(page, SCREENSHOT)


# The learner's own quick experiment: a %%ddp cell (ddp_lab/magic.py) that never ends.
CELLS = ["import ddp_lab", "%load_ext ddp_lab", """\
%%ddp -n 2 --timeout 600
import os, time
print("started", os.getpid(), flush=True)
time.sleep(600)"""]


@pytest.mark.timeout(240)
def test_stop_button_stops_every_rank(lab, page):
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c) for c in CELLS])
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3 (ipykernel)",
                                 "language": "python"}
    nbformat.write(nb, lab.root / "interrupt.ipynb")
    last = len(CELLS) - 1

    lab_ui.open_notebook(page, lab, "interrupt.ipynb")
    lab_ui.menu(page, "Run", "runmenu:run-all")
    lab_ui.wait_for_output(page, last, ["[rank 0] started", "[rank 1] started"], timeout_s=120)
    shown = lab_ui.output_text(page, last)
    pids = [int(pid) for pid in re.findall(r"\[rank \d\] started (\d+)", shown)]
    ranks_of_this_server = {p.pid for p in psutil.Process(lab.process.pid).children(recursive=True)}
    assert len(pids) == 2 and set(pids) <= ranks_of_this_server, (pids, shown)

    lab_ui.toolbar(page, "notebook:interrupt-kernel")
    lab_ui.wait_for_output(page, last, ["KeyboardInterrupt"], timeout_s=60)
    lab_ui.wait_cells_done(page, timeout_s=60)
    assert wait_until_gone(pids, seconds=5) == [], f"ranks survived the stop button: {pids}"
