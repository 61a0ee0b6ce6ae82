"""Execute the course notebooks headless in a real Jupyter kernel, as CI and a learner would.

A real kernel matters: the launcher's whole reason to exist is that code defined in a
kernel's ``__main__`` behaves differently from code in a script (see DESIGN.md), so running
the notebooks as plain Python would test the wrong thing. Each notebook leaves three
artifacts under the build folder: the executed copy, an HTML page (also for a failed
notebook, so the traceback is one click away), and a shared ``index.html``.
"""

from __future__ import annotations

import html
import os
import re
import site
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable

import nbformat
from jupyter_client import AsyncKernelManager
from jupyter_client.kernelspec import KernelSpecManager
from nbclient import NotebookClient
from nbclient.exceptions import CellExecutionError, CellTimeoutError, DeadKernelError
from nbconvert import HTMLExporter
from traitlets import default

from ddp_lab.tools.solved import solved_copy, unsolved_checks

Progress = Callable[[str], object]


@dataclass(frozen=True)
class NotebookReport:
    """What happened to one notebook; ``failed_cell`` counts code cells from 1."""

    path: Path
    seconds: float
    ok: bool
    failed_cell: int | None = None
    failed_source: str = ""
    failed_line: tuple[int, str] | None = None
    error_name: str = ""
    error_message: str = ""
    executed_path: Path | None = None
    html_path: Path | None = None

    @property
    def name(self) -> str:
        return self.path.name

    @property
    def error(self) -> str:
        """``ename: evalue``, the way Jupyter prints the last traceback line."""
        return f"{self.error_name}: {self.error_message}" if self.error_name else ""

    def describe(self) -> str:
        """One line for a terminal: where it failed and why, or how long it took."""
        if self.ok:
            return f"{self.name}: ok in {self.seconds:.1f} s"
        where = f"code cell {self.failed_cell}" if self.failed_cell else "kernel start"
        if self.failed_source:
            where += f" ({self.failed_source!r})"
        if self.failed_line:
            where += f", line {self.failed_line[0]}: {self.failed_line[1]!r}"
        return f"{self.name}: FAILED at {where} after {self.seconds:.1f} s: {self.error}"

    def printed_tail(self, limit: int = 4000) -> str:
        """The last ``limit`` characters the executed copy's cells printed (streams and
        text results), each cell headed by its number.

        Why: a bare ``assert`` in a check cell fails with no message; what the cells above
        printed (a subprocess's output, a rank's error) is what says why, and in CI the
        executed copy is gone with the machine.
        """
        if self.executed_path is None or not self.executed_path.exists():
            return ""
        nb = nbformat.read(self.executed_path, as_version=4)
        parts = []
        for number, cell in enumerate((c for c in nb.cells if c.cell_type == "code"), 1):
            text = "".join(_output_text(o) for o in cell.get("outputs", []))
            if text:
                parts.append(f"[cell {number}]\n{text}")
        return "\n".join(parts)[-limit:]


def _output_text(output) -> str:
    if output.output_type == "stream":
        return output.text
    return output.get("data", {}).get("text/plain", "") if "data" in output else ""


class CurrentInterpreterKernel(AsyncKernelManager):
    """A kernel manager whose ``python3`` is always this interpreter's ipykernel.

    Why: a kernelspec in a user or system Jupyter folder (say ~/.local/share/jupyter, or
    /usr/local/share/jupyter) would otherwise shadow it and run the notebooks in another
    Python without this venv's torch and ddp_lab. With no kernel folders to search,
    jupyter_client falls back to ipykernel's built-in spec, which launches sys.executable.
    """

    @default("kernel_spec_manager")
    def _kernel_spec_manager_default(self) -> KernelSpecManager:
        return KernelSpecManager(kernel_dirs=[])


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


def code_cell_number(nb: nbformat.NotebookNode, cell_index: int) -> int:
    """The 1-based position of cell ``cell_index`` among the code cells."""
    cells = nb.cells[: cell_index + 1]
    return sum(c.cell_type == "code" for c in cells)


def _first_line(source: str) -> str:
    lines = [line for line in source.splitlines() if line.strip()]
    return lines[0].strip() if lines else ""


ANSI_ESCAPE = re.compile(r"\x1b\[[0-9;]*m")
CELL_FRAME = re.compile(r"Cell In\[\d+\], line (\d+)")


def _failing_line(exc: Exception, source: str) -> tuple[int, str] | None:
    """(number, text) of the cell's line the exception came from, read from IPython's
    traceback (its first ``Cell In[N], line K`` frame is the cell's own).

    Why: a check cell holds a dozen bare ``assert`` lines, and an AssertionError has no
    message; in CI the executed copy with its traceback is gone with the machine.
    """
    if not isinstance(exc, CellExecutionError):
        return None
    frame = CELL_FRAME.search(ANSI_ESCAPE.sub("", exc.traceback))
    lines = source.splitlines()
    if frame is None or not 1 <= int(frame.group(1)) <= len(lines):
        return None
    number = int(frame.group(1))
    return number, lines[number - 1].strip()


def _error_of(exc: Exception) -> tuple[str, str]:
    """(ename, evalue): the kernel's exception for a failing cell, else our own error."""
    if isinstance(exc, CellExecutionError):
        return exc.ename, exc.evalue
    if isinstance(exc, CellTimeoutError):
        return "CellTimeoutError", str(exc).splitlines()[0]
    if isinstance(exc, DeadKernelError):
        return "DeadKernelError", str(exc) or "the kernel died while running this cell"
    return type(exc).__name__, str(exc)


def _execute(nb, cwd: Path, timeout: float) -> tuple[int | None, Exception | None]:
    """Run ``nb`` in place; return (index of the last cell started, the error or None)."""
    current: list[int] = []
    client = NotebookClient(
        nb,
        timeout=timeout,
        kernel_name="python3",
        kernel_manager_class=CurrentInterpreterKernel,
        resources={"metadata": {"path": str(cwd)}},
        # ipykernel >= 7 warns on every start that local TCP is unencrypted; errors still show.
        extra_arguments=["--IPKernelApp.log_level=ERROR"],
        on_cell_execute=lambda cell, cell_index: current.append(cell_index),
    )
    try:
        client.execute(env=kernel_env())
    except Exception as exc:  # noqa: BLE001 - any failure becomes a report, not a crash
        return (current[-1] if current else None), exc
    return None, None


def _report(path: Path, nb, seconds: float, cell_index, exc) -> NotebookReport:
    """Turn what ``_execute`` saw into a report naming the failing code cell."""
    if exc is None:
        return NotebookReport(path=path, seconds=seconds, ok=True)
    ename, evalue = _error_of(exc)
    cell = None if cell_index is None else code_cell_number(nb, cell_index)
    source = "" if cell_index is None else nb.cells[cell_index].source
    return NotebookReport(path, seconds, False, cell, _first_line(source),
                          _failing_line(exc, source), ename, evalue)


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
    solved: bool = False,
) -> NotebookReport:
    """Execute one notebook in a fresh kernel, cells running in the notebook's folder.

    Writes ``out_dir/notebooks/NAME.ipynb`` and ``out_dir/html/NAME.html`` and never
    raises for a failing notebook: the report says which code cell failed and why.
    ``solved=True`` first replaces every exercise cell with the reference solution
    (tools/solved.py), and fails the notebook if a check still says "not solved yet".
    """
    path = Path(path).resolve()
    nb = nbformat.read(path, as_version=4)
    if solved:
        nb = nbformat.from_dict(solved_copy(nb))
    start = time.perf_counter()
    cell_index, exc = _execute(nb, path.parent, timeout_per_cell)
    if solved and exc is None:
        cell_index, exc = _first_unsolved(nb)
    report = _report(path, nb, time.perf_counter() - start, cell_index, exc)
    return _write_outputs(nb, report, Path(out_dir).resolve())


class UnsolvedInSolvedMode(RuntimeError):
    """A check said "not solved yet" although its exercise cell held the solution."""


def _first_unsolved(nb) -> tuple[int | None, Exception | None]:
    from ddp_lab.exercises import NOT_SOLVED
    cells = unsolved_checks(nb, NOT_SOLVED)
    if not cells:
        return None, None
    return cells[0], UnsolvedInSolvedMode(f"the check says {NOT_SOLVED!r} in solved mode")


def _index_row(report: NotebookReport, build_dir: Path) -> str:
    status = "ok" if report.ok else "FAILED"
    detail = "" if report.ok else html.escape(report.describe())
    links = " ".join(
        f'<a href="{p.relative_to(build_dir).as_posix()}">{label}</a>'
        for p, label in ((report.html_path, "html"), (report.executed_path, "ipynb"))
        if p is not None
    )
    return (
        f'<tr class="{status.lower()}"><td>{html.escape(report.name)}</td><td>{status}</td>'
        f"<td>{report.seconds:.1f}</td><td>{links}</td><td>{detail}</td></tr>"
    )


def write_index(reports: list[NotebookReport], build_dir: Path | str) -> Path:
    """``build_dir/index.html``: one row per notebook with status, seconds and links."""
    build_dir = Path(build_dir).resolve()
    passed = sum(r.ok for r in reports)
    rows = "\n".join(_index_row(r, build_dir) for r in reports)
    page = f"""<!DOCTYPE html>
<html><head><meta charset="utf-8"><title>ddp-lab notebooks</title>
<style>body{{font-family:sans-serif}} td,th{{padding:4px 10px;text-align:left}}
tr.failed{{background:#fdd}} tr.ok{{background:#efe}}</style></head>
<body><h1>ddp-lab notebooks: {passed}/{len(reports)} passed</h1>
<table><tr><th>notebook</th><th>status</th><th>seconds</th><th>links</th><th>error</th></tr>
{rows}
</table></body></html>
"""
    index = build_dir / "index.html"
    index.parent.mkdir(parents=True, exist_ok=True)
    index.write_text(page, encoding="utf-8")
    return index


def run_all(
    notebook_dir: Path | str,
    build_dir: Path | str,
    pattern: str = "*.ipynb",
    progress: Progress = print,
    timeout_per_cell: float = 300.0,
    solved: bool = False,
) -> list[NotebookReport]:
    """Execute every matching notebook in order, then write ``build_dir/index.html``."""
    notebooks = find_notebooks(notebook_dir, pattern)
    reports = []
    for i, path in enumerate(notebooks, 1):
        progress(f"[{i}/{len(notebooks)}] {path.name} ...")
        report = execute_notebook(path, build_dir, timeout_per_cell, solved)
        progress(f"[{i}/{len(notebooks)}] {report.describe()}")
        reports.append(report)
    write_index(reports, build_dir)
    return reports
