"""Execute the course notebooks headless in a real Jupyter kernel, as CI and a learner would.

A real kernel matters: the launcher's whole reason to exist is that code defined in a
kernel's ``__main__`` behaves differently from code in a script (see DESIGN.md), so running
the notebooks as plain Python would test the wrong thing. Each notebook leaves three
artifacts under the build folder: the executed copy, an HTML page (also for a failed
notebook, so the traceback is one click away), and the course's front page ``index.html``
(tools/front_page.py).
"""

from __future__ import annotations

import os
import shutil
import site
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Callable

import nbformat
from jupyter_client import AsyncKernelManager
from jupyter_client.kernelspec import KernelSpecManager
from nbclient import NotebookClient
from nbconvert import HTMLExporter
from traitlets import default

from ddp_lab.tools.front_page import write_index
from ddp_lab.tools.notebook_report import NotebookReport, code_cell_number, report_of
from ddp_lab.tools.progress_live import LiveProgress
from ddp_lab.tools.solved import solved_copy, unsolved_checks

Progress = Callable[[str], object]
CellStarted = Callable[[int, int], object]  # (code cell number from 1, code cells in all)


class OwnKernel:
    """Traits for a kernel manager: this interpreter's ``python3``, over Unix sockets in a
    private folder.

    Why this interpreter: a kernelspec in a user or system Jupyter folder (say
    ~/.local/share/jupyter, or /usr/local/share/jupyter) would otherwise shadow it and run
    the notebooks in another Python without this venv's torch and ddp_lab. With no kernel
    folders to search, jupyter_client falls back to ipykernel's built-in spec, which
    launches sys.executable.
    Why Unix sockets: over TCP, jupyter_client picks five free ports, closes them and
    hands them to the kernel to bind; anything else on the machine that binds a free port
    in between (a test's rendezvous, another kernel) takes one, and the kernel dies with
    EADDRINUSE ("Kernel didn't respond in 60 seconds"). A socket file named after the
    kernel's own connection file cannot be taken.
    Why a private folder: jupyter_client names the sockets after the connection file (its
    name less ``.json`` plus ``-ipc-N``). In the shared /tmp every user sees those names and
    can bind them first: the kernel died at start and its client connected to the
    squatter's sockets. In a 0700 folder of a random name
    nobody else can see or create them.
    """

    _private_folder: str | None = None  # made by _connection_file_default, removed with it

    @default("kernel_spec_manager")
    def _kernel_spec_manager_default(self) -> KernelSpecManager:
        return KernelSpecManager(kernel_dirs=[])

    @default("transport")
    def _transport_default(self) -> str:
        return "ipc"

    @default("connection_file")
    def _connection_file_default(self) -> str:
        """``k.json`` in a new folder of its own (mkdtemp: 0700, a random name). Absolute,
        so the kernel (started in the notebook's folder) finds the same sockets, and short:
        a socket's path may hold 107 bytes, and ``/tmp/ddp-lab-k-XXXXXXXX/k-ipc-5`` is 31
        (Jupyter's runtime folder under a long home may not fit)."""
        self._private_folder = tempfile.mkdtemp(prefix="ddp-lab-k-")
        return os.path.join(self._private_folder, "k.json")

    def cleanup_connection_file(self) -> None:
        """The connection file, the sockets beside it and their folder: the manager calls
        this when the kernel stops for good (not on a restart) and when it is collected;
        ``_execute`` calls it whatever happened. Idempotent."""
        super().cleanup_connection_file()
        if self._private_folder is not None:
            shutil.rmtree(self._private_folder, ignore_errors=True)
            self._private_folder = None


class CurrentInterpreterKernel(OwnKernel, AsyncKernelManager):
    """The async manager nbclient drives (OwnKernel says why)."""


def find_notebooks(notebook_dir: Path | str, pattern: str = "*.ipynb") -> list[Path]:
    """Notebooks in name order (00_, 01_, ...), skipping Jupyter's checkpoint copies."""
    found = Path(notebook_dir).glob(pattern)
    return sorted(p for p in found if ".ipynb_checkpoints" not in p.parts and p.is_file())


INLINE_BACKEND = "module://matplotlib_inline.backend_inline"


def kernel_env() -> dict[str, str]:
    """Our environment plus the folder this ddp_lab was imported from on PYTHONPATH, and
    matplotlib's inline backend.

    Why PYTHONPATH: cells run in the notebook's folder, so from an uninstalled checkout
    (``python -m ddp_lab notebooks`` in the repo root) the kernel would import no ddp_lab,
    or a different installed copy than the one running this code.
    Why MPLBACKEND: ipykernel picks the inline backend only when MPLBACKEND is unset
    (ipykernel/kernelapp.py); an inherited ``MPLBACKEND=Agg``, common on headless servers
    and in containers, would make every ``plt.show()`` draw nothing into the notebook.
    """
    env = dict(os.environ, MPLBACKEND=INLINE_BACKEND)
    root = str(Path(__file__).resolve().parents[1])
    if root not in site.getsitepackages() + [site.getusersitepackages()]:
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [root, env.get("PYTHONPATH")]))
    # Silences debugpy's "frozen modules" warning, printed by every 3.11+ kernel at start.
    env.setdefault("PYDEVD_DISABLE_FILE_VALIDATION", "1")
    return env


def _execute(nb, cwd: Path, timeout: float, on_cell: CellStarted | None = None,
             ) -> tuple[int | None, Exception | None]:
    """Run ``nb`` in place; return (index of the last cell started, the error or None).
    ``on_cell(k, n)`` hears that code cell k of n starts."""
    current: list[int] = []
    code_cells = sum(cell.cell_type == "code" for cell in nb.cells)

    def started(cell, cell_index: int) -> None:
        current.append(cell_index)
        if on_cell is not None:
            on_cell(code_cell_number(nb, cell_index), code_cells)

    manager = CurrentInterpreterKernel(kernel_name="python3")
    client = NotebookClient(
        nb,
        km=manager,  # ours, so that its folder is removed below (OwnKernel says why)
        timeout=timeout,
        resources={"metadata": {"path": str(cwd)}},
        # ipykernel >= 7 warns on every start that local sockets are unencrypted; errors show.
        extra_arguments=["--IPKernelApp.log_level=ERROR"],
        on_cell_execute=started,
    )
    try:
        client.execute(env=kernel_env(), cleanup_kc=True)  # it stops our kernel as its own
    except Exception as exc:  # noqa: BLE001 - any failure becomes a report, not a crash
        return (current[-1] if current else None), exc
    finally:  # also a kernel that never started, and the stop button
        manager.cleanup_connection_file()
    return None, None


def _with_banner(nb: nbformat.NotebookNode, report: NotebookReport) -> nbformat.NotebookNode:
    """A copy of ``nb`` that opens with the failure, for the HTML page only.

    Why: a timeout or a dead kernel leaves no traceback in any cell output.
    """
    banner = nbformat.v4.new_markdown_cell(f"**Execution failed.** `{report.describe()}`")
    copy = nbformat.from_dict(nb)
    copy.cells.insert(0, banner)
    return copy


def _write_outputs(nb, report: NotebookReport, build_dir: Path) -> NotebookReport:
    executed = build_dir / "notebooks" / report.name
    page = build_dir / "html" / f"{report.path.stem}.html"
    executed.parent.mkdir(parents=True, exist_ok=True)
    page.parent.mkdir(parents=True, exist_ok=True)
    nbformat.write(nb, executed)
    shown = nb if report.ok else _with_banner(nb, report)
    body, _ = HTMLExporter().from_notebook_node(shown)
    page.write_text(body, encoding="utf-8")
    return replace(report, executed_path=executed, html_path=page)


def execute_notebook(
    path: Path | str, out_dir: Path | str, timeout_per_cell: float = 300.0,
    solved: bool = False, on_cell: CellStarted | None = None,
) -> NotebookReport:
    """Execute one notebook in a fresh kernel, cells running in the notebook's folder.

    Writes ``out_dir/notebooks/NAME.ipynb`` and ``out_dir/html/NAME.html`` and never
    raises for a failing notebook: the report says which code cell failed and why.
    ``solved=True`` first replaces every exercise cell with the reference solution
    (tools/solved.py), and fails the notebook if a check still says "not solved yet".
    ``on_cell(k, n)`` is told when code cell k of n starts (live progress).
    """
    path = Path(path).resolve()
    nb = nbformat.read(path, as_version=4)
    if solved:
        nb = nbformat.from_dict(solved_copy(nb))
    started_at, start = time.time(), time.perf_counter()
    cell_index, exc = _execute(nb, path.parent, timeout_per_cell, on_cell)
    if solved and exc is None:
        cell_index, exc = _first_unsolved(nb)
    report = report_of(path, nb, time.perf_counter() - start, cell_index, exc)
    report = replace(report, started_at=started_at)
    return _write_outputs(nb, report, Path(out_dir).resolve())


class UnsolvedInSolvedMode(RuntimeError):
    """A check said "not solved yet" although its exercise cell held the solution."""


def _first_unsolved(nb) -> tuple[int | None, Exception | None]:
    from ddp_lab.exercises import NOT_SOLVED
    cells = unsolved_checks(nb, NOT_SOLVED)
    if not cells:
        return None, None
    return cells[0], UnsolvedInSolvedMode(f"the check says {NOT_SOLVED!r} in solved mode")


def run_all(
    notebook_dir: Path | str,
    build_dir: Path | str,
    pattern: str = "*.ipynb",
    progress: Progress = print,
    timeout_per_cell: float = 300.0,
    solved: bool = False,
) -> list[NotebookReport]:
    """Execute every matching notebook in order, then write ``build_dir/index.html``, the
    front page (a partial run updates its notebooks' entries and keeps the others), and
    the learner's progress (tools/progress.py).

    ``progress`` hears one line as each notebook starts and one as it ends; given a
    tools/progress_live.LiveProgress, its status line shows the notebook's running cell
    and time instead of the first line."""
    notebooks = find_notebooks(notebook_dir, pattern)
    live = progress if isinstance(progress, LiveProgress) else None
    reports = []
    for i, path in enumerate(notebooks, 1):
        label = f"[{i}/{len(notebooks)}] {path.name}"
        if live is None:
            progress(f"{label} ...")
        else:
            live.notebook(label)
        try:
            report = execute_notebook(path, build_dir, timeout_per_cell, solved,
                                      on_cell=None if live is None else live.cell)
        finally:
            if live is not None:
                live.done()
        progress(f"[{i}/{len(notebooks)}] {report.describe()}")
        reports.append(report)
    write_index(reports, build_dir, solved=solved)
    return reports

