"""The notebook a submission's kernel runs: what the grade rests on, and nothing else.

Of the learner's notebook, up to its last exercise cell: every exercise cell whole (the
learner's code), and of the other code cells only the statements that import or define
(``import``, ``def``, ``class``, an assignment whose value calls nothing), so that demos,
plots, benchmarks and check cells never run: the grade rests on the exercise functions, which
the course's checkers judge in another process. After each exercise cell, a cell writes the
function that its stub names (``ddp_lab.launch.payload.dumps``) to ``EXERCISE.payload`` in
the kernel's folder (the exercise cell keeps its name in its metadata, so that what it
raised can be quoted); a function that the cell does not define leaves no file, and the grade
says "no function NAME in the notebook".
"""

from __future__ import annotations

import ast

import nbformat
from nbformat.v4 import new_code_cell
from IPython.core.inputtransformer2 import TransformerManager

from ddp_lab.grading.submission import CourseNotebook
from ddp_lab.tools.solved import cell_source, exercise_cells

PAYLOAD_SUFFIX = ".payload"

# The cell that hands one function over. Names start with two underscores so that they
# shadow nothing the learner defined; it writes nothing when the name is not a callable.
DUMP_CELL = """\
def __ddp_lab_grade_dump(exercise, name):
    import ddp_lab.launch.payload
    found = globals().get(name)
    if callable(found):
        with open(exercise + {suffix!r}, "wb") as out:
            out.write(ddp_lab.launch.payload.dumps(found))
__ddp_lab_grade_dump({exercise!r}, {name!r})
del __ddp_lab_grade_dump
"""


def kernel_notebook(notebook: CourseNotebook) -> nbformat.NotebookNode:
    """The notebook the kernel runs for ``notebook`` (the module docstring says what)."""
    tagged = dict(exercise_cells(notebook.nb))
    last = max((i for i, name in tagged.items() if name in notebook.functions), default=-1)
    cells = []
    for index, cell in enumerate(notebook.nb.cells[:last + 1]):
        if cell.get("cell_type") != "code":
            continue
        exercise = tagged.get(index)
        if exercise in notebook.functions:
            cells.append(new_code_cell(cell_source(cell), metadata={"exercise": exercise}))
            cells.append(new_code_cell(DUMP_CELL.format(
                suffix=PAYLOAD_SUFFIX, exercise=exercise, name=notebook.functions[exercise])))
        else:
            kept = definitions_only(cell_source(cell))
            if kept:
                cells.append(new_code_cell(kept))
    out = nbformat.v4.new_notebook()
    out.cells = cells
    out.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3",
                                  "language": "python"}
    return out


def definitions_only(source: str) -> str:
    """The statements of a cell that import or define, in order ("" when none): magics
    (``%matplotlib``, ``%%ddp``) become calls, and calls are left out."""
    try:
        python = TransformerManager().transform_cell(source)
        tree = ast.parse(python)
    except (SyntaxError, ValueError):  # a cell that does not parse defines nothing
        return ""
    lines = python.splitlines()
    return "\n".join("\n".join(lines[_first_line(node) - 1:node.end_lineno])
                     for node in tree.body if _defines(node))


def _first_line(node: ast.stmt) -> int:
    """Where a statement starts, its decorators included."""
    return min([node.lineno] + [d.lineno for d in getattr(node, "decorator_list", [])])


def _defines(node: ast.stmt) -> bool:
    if isinstance(node, (ast.Import, ast.ImportFrom, ast.FunctionDef, ast.AsyncFunctionDef,
                         ast.ClassDef)):
        return True
    if isinstance(node, (ast.Assign, ast.AnnAssign)) and node.value is not None:
        return not any(isinstance(n, ast.Call) for n in ast.walk(node.value))
    return False
