"""What happened to one notebook: the report ``execute_notebook`` returns, read from
nbclient's errors and IPython's traceback.

Why a module of its own: the runner drives a kernel; this reads what it left behind (which
code cell failed, on which line, why, and what the cells printed), the part a failing CI
run is read by.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import nbformat
from nbclient.exceptions import CellExecutionError, CellTimeoutError, DeadKernelError


@dataclass(frozen=True)
class NotebookReport:
    """What happened to one notebook; ``failed_cell`` counts code cells from 1,
    ``failed_line`` is (line number in that cell, its text) when the traceback names it,
    ``started_at`` is when the run of this notebook began (``time.time()``; 0 unknown)."""

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
    started_at: float = 0.0

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


def report_of(path: Path, nb, seconds: float, cell_index, exc) -> NotebookReport:
    """Turn what the runner saw (the last cell started, the error or None) into a report
    naming the failing code cell and line."""
    if exc is None:
        return NotebookReport(path=path, seconds=seconds, ok=True)
    ename, evalue = _error_of(exc)
    cell = None if cell_index is None else code_cell_number(nb, cell_index)
    source = "" if cell_index is None else nb.cells[cell_index].source
    return NotebookReport(path, seconds, False, cell, _first_line(source),
                          _failing_line(exc, source), ename, evalue)
