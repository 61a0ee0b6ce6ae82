"""What the learner's own check of an exercise said in this run: solved, not solved yet,
failed (with the first line of the feedback), or not checked.

Why not any cell that mentions the exercise: a notebook may check other functions with the
same checker after the learner's check, to teach (07b shows the reference ``scratch.DDP``
refused after the learner's ``MyDDP``; 01 checks a deliberately wrong barrier). The
learner's check is the first check of the exercise after its stub cell (the code cell
tagged ``exercise``), preferring one that passes a name the stub cell defines; only its
outputs count. Pure functions on a notebook node.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass

from ddp_lab.tools.solved import cell_source, exercise_cells

SOLVED, NOT_SOLVED, FAILED, NOT_CHECKED = (
    "solved", "not solved yet", "failed", "not checked in this run")


@dataclass(frozen=True)
class CheckResult:
    status: str  # one of SOLVED, NOT_SOLVED, FAILED, NOT_CHECKED
    feedback: str  # the first line of what the check said; "" when it did not run


def learner_check(nb, name: str) -> CheckResult:
    """The status of exercise ``name`` from the outputs of the learner's check cell."""
    index = learner_check_cell(nb, name)
    if index is None:
        return CheckResult(NOT_CHECKED, "")
    return _read_outputs(nb.cells[index], name)


def learner_check_cell(nb, name: str) -> int | None:
    """Index of the learner's check cell of ``name``: after the stub cell, the first check
    whose function is a name the stub cell binds, else the first check at all."""
    stubs = [i for i, named in exercise_cells(nb) if named == name]
    start = stubs[0] + 1 if stubs else 0
    bound = _bound_names(cell_source(nb.cells[stubs[0]])) if stubs else set()
    checks = [(i, checked) for i in range(start, len(nb.cells))
              for checked in [_checked_function(nb.cells[i], name)] if checked is not None]
    own = [i for i, checked in checks if checked in bound]
    anywhere = [i for i, _ in checks]
    return (own or anywhere or [None])[0]


def _checked_function(cell, name: str) -> str | None:
    """What ``check("name", X)`` passes as X in this code cell ("" if not a plain name),
    or None when the cell does not check ``name``."""
    if cell.get("cell_type") != "code":
        return None
    call = re.search(rf"""\bcheck\(\s*["']{re.escape(name)}["']\s*,\s*([\w.]*)""",
                     cell_source(cell))
    return None if call is None else call.group(1)


def _bound_names(source: str) -> set[str]:
    """Names the stub cell defines at its top level: functions, classes, assignments (the
    solved mode binds the reference to the stub's name by assignment)."""
    try:
        body = ast.parse(source).body
    except SyntaxError:  # a learner's half-written cell: fall back to a plain reading
        return set(re.findall(r"^(?:def|class)\s+(\w+)", source, re.M))
    names = {node.name for node in body
             if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))}
    for node in body:
        if isinstance(node, ast.Assign):
            names |= {t.id for t in node.targets if isinstance(t, ast.Name)}
    return names


def _read_outputs(cell, name: str) -> CheckResult:
    for output in cell.get("outputs", []):
        if output.get("output_type") == "error":
            return CheckResult(FAILED, _error_line(output))
        for line in _stream_text(output).splitlines():
            for status, said in ((SOLVED, "passed"), (NOT_SOLVED, NOT_SOLVED)):
                if line.startswith(f"{name}: {said}"):
                    return CheckResult(status, _after(line, f"{name}: {said}"))
    return CheckResult(NOT_CHECKED, "")


def _after(line: str, prefix: str) -> str:
    return line[len(prefix):].lstrip(". ").strip()


def _error_line(output) -> str:
    """The first line of the error: ExerciseFailed's own sentence, else ``Name: message``."""
    first = (output.get("evalue") or "").strip().splitlines()
    message = first[0] if first else ""
    ename = output.get("ename", "")
    return message if ename == "ExerciseFailed" else f"{ename}: {message}".rstrip(": ")


def _stream_text(output) -> str:
    text = output.get("text", "") if output.get("output_type") == "stream" else ""
    return "".join(text) if isinstance(text, list) else text
