"""The headless runner on two tiny notebooks: one passes (with a figure), one fails in cell 2."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import nbformat
import psutil
import pytest

from ddp_lab.tools import cli
from ddp_lab.tools.notebook_runner import execute_notebook, run_all

REPO = Path(__file__).resolve().parents[2]

PASSING = [
    nbformat.v4.new_markdown_cell("# A passing notebook"),
    # Reading a file next to the notebook checks that cells run in the notebook's folder.
    nbformat.v4.new_code_cell("message = open('data.txt').read().strip()\nmessage"),
    nbformat.v4.new_code_cell(
        "import matplotlib.pyplot as plt\nfig, ax = plt.subplots()\nax.plot([1, 4, 9])\nplt.show()"
    ),
]
FAILING = [
    nbformat.v4.new_code_cell("x = 1\nprint('x is', x)"),
    nbformat.v4.new_markdown_cell("Markdown cells do not count as code cells."),
    nbformat.v4.new_code_cell("# second code cell\nraise ValueError('boom in the second cell')"),
    nbformat.v4.new_code_cell("never = 'reached'"),
]


@pytest.fixture
def course(tmp_path: Path) -> Path:
    """A notebooks folder with ``a_pass.ipynb``, ``b_fail.ipynb`` and a data file."""
    folder = tmp_path / "notebooks"
    folder.mkdir()
    (folder / "data.txt").write_text("hello from the notebook folder\n")
    for name, cells in (("a_pass", PASSING), ("b_fail", FAILING)):
        nbformat.write(nbformat.v4.new_notebook(cells=cells), folder / f"{name}.ipynb")
    return folder


@pytest.fixture(autouse=True)
def no_leftover_processes():
    """Every kernel this test started is gone when it ends (waits a little for shutdown)."""
    me = psutil.Process()
    before = {p.pid for p in me.children(recursive=True)}
    yield
    new = [p for p in me.children(recursive=True) if p.pid not in before]
    _, alive = psutil.wait_procs(new, timeout=10)
    assert not alive, f"processes left running: {[p.cmdline() for p in alive]}"


def _outputs(path: Path) -> list[dict]:
    nb = nbformat.read(path, as_version=4)
    return [out for cell in nb.cells if cell.cell_type == "code" for out in cell.outputs]


@pytest.mark.timeout(120)
def test_passing_notebook_is_executed_with_its_figure(course: Path, tmp_path: Path):
    build = tmp_path / "build"
    report = execute_notebook(course / "a_pass.ipynb", build, timeout_per_cell=60)

    assert report.ok, report.describe()
    assert report.failed_cell is None and report.error == ""
    assert report.executed_path == build / "notebooks" / "a_pass.ipynb"
    outputs = _outputs(report.executed_path)
    assert any("hello from the notebook folder" in str(o.get("data", {})) for o in outputs)
    assert any("image/png" in o.get("data", {}) for o in outputs), "figure not captured"
    assert (build / "html" / "a_pass.html").read_text().count("<img") >= 1


KERNEL_FILES = nbformat.v4.new_code_cell(
    "import json, os, stat\n"
    "from ipykernel.connect import get_connection_file\n"
    "folder = os.path.dirname(get_connection_file())\n"
    "print(json.dumps({'folder': folder, 'mode': stat.S_IMODE(os.stat(folder).st_mode),\n"
    "                  'names': sorted(os.listdir(folder))}))")


@pytest.mark.timeout(120)
@pytest.mark.parametrize("ending", ["passes", "kernel dies"])
def test_the_kernels_sockets_are_in_a_private_folder_removed_after_the_run(
        tmp_path: Path, ending: str):
    """Nobody else can see or bind the kernel's socket names (in the shared /tmp they
    could), and nothing is left, also when the kernel dies."""
    dies = [nbformat.v4.new_code_cell("import os\nos._exit(1)")] if ending != "passes" else []
    path = tmp_path / "files.ipynb"
    nbformat.write(nbformat.v4.new_notebook(cells=[KERNEL_FILES, *dies]), path)

    report = execute_notebook(path, tmp_path / "build", timeout_per_cell=60)

    assert report.ok == (ending == "passes"), report.describe()
    seen = json.loads(_outputs(report.executed_path)[0]["text"])
    # 0o700, plus the sticky bit that jupyter_client sets on a connection file's folder
    assert seen["mode"] & 0o777 == 0o700 and "k.json" in seen["names"]
    sockets = [name for name in seen["names"] if re.fullmatch(r"k-ipc-\d+", name)]
    assert len(sockets) == len(seen["names"]) - 1 >= 5
    assert all(len(os.path.join(seen["folder"], name)) < 107 for name in sockets)
    assert not os.path.exists(seen["folder"])


@pytest.mark.timeout(120)
def test_each_code_cell_is_announced_as_it_starts_and_the_report_knows_when_it_ran(
        course: Path, tmp_path: Path):
    """What the live progress line reads: code cell k of n (markdown cells do not count),
    in order, up to the failing one; and the start's time of day for the front page."""
    heard: list[tuple[int, int]] = []
    before = time.time()
    report = execute_notebook(course / "b_fail.ipynb", tmp_path / "build", 60,
                              on_cell=lambda k, n: heard.append((k, n)))
    assert heard == [(1, 3), (2, 3)]  # cell 3 never ran: cell 2 failed
    assert before <= report.started_at <= before + report.seconds + 60


@pytest.mark.timeout(120)
def test_figures_are_kept_when_the_environment_says_mplbackend_agg(
        course: Path, tmp_path: Path, monkeypatch):
    """Headless servers and containers often export MPLBACKEND=Agg; a kernel that inherited
    it would let plt.show() draw nothing into the notebook."""
    monkeypatch.setenv("MPLBACKEND", "Agg")
    report = execute_notebook(course / "a_pass.ipynb", tmp_path / "build", timeout_per_cell=60)

    assert report.ok, report.describe()
    outputs = _outputs(report.executed_path)
    assert any("image/png" in o.get("data", {}) for o in outputs), "figure lost under Agg"


def _exercise_notebook() -> nbformat.NotebookNode:
    """Notebook 00's exercise as shipped: the stub cell (tagged, named) and its check."""
    stub = nbformat.v4.new_code_cell(
        'def max_over_ranks(value):\n    """The largest value over all ranks."""\n'
        "    raise NotImplementedError",
        metadata={"tags": ["exercise"], "exercise": "00.max_over_ranks"})
    check = nbformat.v4.new_code_cell(
        'import ddp_lab.exercises as ex\nex.check("00.max_over_ranks", max_over_ranks);')
    return nbformat.v4.new_notebook(cells=[stub, check])


@pytest.mark.timeout(180)
def test_solved_mode_runs_the_reference_in_the_exercise_cell(tmp_path: Path):
    """``ddp-lab notebooks --solved`` swaps the reference into the cell and the check
    passes; every exercise's reference is checked as such a cell in
    tests/exercises/test_notebook_cells.py, without a kernel per notebook."""
    nbformat.write(_exercise_notebook(), tmp_path / "ex.ipynb")
    report = execute_notebook(tmp_path / "ex.ipynb", tmp_path / "build", 120, solved=True)
    assert report.ok, report.describe()
    printed = [o.get("text", "") for o in _outputs(report.executed_path)]
    assert any("00.max_over_ranks: passed." in text for text in printed), printed


@pytest.mark.timeout(120)
def test_failing_notebook_reports_cell_and_error(course: Path, tmp_path: Path):
    build = tmp_path / "build"
    report = execute_notebook(course / "b_fail.ipynb", build, timeout_per_cell=60)

    assert not report.ok
    assert report.failed_cell == 2
    assert report.failed_source == "# second code cell"
    assert report.error == "ValueError: boom in the second cell"
    # The line that raised, from the traceback: a bare assert among many has no message.
    assert report.failed_line == (2, "raise ValueError('boom in the second cell')")
    line = report.describe()
    assert "b_fail.ipynb" in line and "code cell 2" in line and "boom" in line
    assert "line 2: \"raise ValueError('boom in the second cell')\"" in line
    # What the cells printed says why an assert without a message failed.
    assert report.printed_tail() == "[cell 1]\nx is 1\n"
    assert report.printed_tail(limit=5) == "is 1\n"
    # The failed notebook still gets its pages, with the traceback visible.
    assert (build / "notebooks" / "b_fail.ipynb").exists()
    assert "boom in the second cell" in (build / "html" / "b_fail.html").read_text()


@pytest.mark.timeout(180)
def test_run_all_writes_index_and_reports_progress(course: Path, tmp_path: Path):
    build = tmp_path / "build"
    lines: list[str] = []
    reports = run_all(course, build, progress=lines.append, timeout_per_cell=60)

    assert [(r.name, r.ok) for r in reports] == [("a_pass.ipynb", True), ("b_fail.ipynb", False)]
    assert len(lines) == 4 and "a_pass.ipynb" in lines[0] and "code cell 2" in lines[3]
    index = (build / "index.html").read_text()
    for link in ("html/a_pass.html", "html/b_fail.html", "notebooks/b_fail.ipynb"):
        assert link in index
    assert "FAILED" in index and "ValueError" in index
    # The front page (tests/notebooks/test_front_page.py): titles, and the figure's thumbnail.
    assert '<a href="html/a_pass.html">A passing notebook</a>' in index
    assert 'src="html/a_pass.thumb.png"' in index and (build / "html/a_pass.thumb.png").exists()


@pytest.mark.timeout(180)
def test_cli_exit_codes(course: Path, tmp_path: Path, capsys):
    build = str(tmp_path / "build")
    argv = ["notebooks", "--dir", str(course), "--build", build, "--timeout", "60"]

    assert cli.main(argv) == 1
    out, err = capsys.readouterr()
    assert "a_pass.ipynb" in out and "status" in out  # the summary table
    assert "b_fail.ipynb" in err and "code cell 2" in err and "ValueError" in err

    assert cli.main(argv + ["--pattern", "a_*.ipynb"]) == 0

    empty = tmp_path / "empty"
    empty.mkdir()
    assert cli.main(["notebooks", "--dir", str(empty), "--build", build]) == 2
    assert "no notebooks" in capsys.readouterr().err


@pytest.mark.timeout(180)
def test_python_dash_m_ddp_lab(course: Path, tmp_path: Path):
    path = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))
    env = {**os.environ, "PYTHONPATH": path}
    cmd = [sys.executable, "-m", "ddp_lab", "notebooks", "--dir", str(course),
           "--build", str(tmp_path / "build"), "--timeout", "60"]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=150)

    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "b_fail.ipynb" in proc.stderr and "code cell 2" in proc.stderr
    assert (tmp_path / "build" / "index.html").exists()


@pytest.mark.timeout(120)
def test_kernel_is_this_interpreter_even_if_a_kernelspec_shadows_it(tmp_path: Path, monkeypatch):
    """A user-level python3 kernelspec for another Python must not hijack the run."""
    spec = tmp_path / "jupyter" / "kernels" / "python3"
    spec.mkdir(parents=True)
    (spec / "kernel.json").write_text(
        '{"argv": ["/nonexistent/python", "-m", "ipykernel_launcher", "-f", "{connection_file}"],'
        ' "display_name": "someone else\'s Python", "language": "python"}'
    )
    monkeypatch.setenv("JUPYTER_PATH", str(tmp_path / "jupyter"))
    path = tmp_path / "which.ipynb"
    cells = [nbformat.v4.new_code_cell("import sys\nprint(sys.executable)")]
    nbformat.write(nbformat.v4.new_notebook(cells=cells), path)

    report = execute_notebook(path, tmp_path / "build", timeout_per_cell=60)

    assert report.ok, report.describe()
    printed = _outputs(report.executed_path)[0]["text"].strip()
    assert Path(printed).resolve() == Path(sys.executable).resolve()
