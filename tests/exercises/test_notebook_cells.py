"""The notebooks' exercise cells and the registry agree: every exercise has exactly one
stub cell, tagged and named in its metadata, followed by its check cell; the shipped cell is
a stub that its check answers with "not solved yet"; and solved mode's cell (the reference
solution's source, ``ddp-lab notebooks --solved``) passes its check.

Both cells run here as a kernel runs them: the cell's source compiled under a file name that
linecache knows (the stub test reads the source back), in a fresh namespace whose
``__name__`` is ``__main__`` (so the function goes to the ranks by value); the stub after
the imports of the cells above it (the capstone's class derives from ``nn.Module``), the
solved cell on its own. That is all the solved notebook run added to the shipped one, in
seconds instead of a kernel per notebook.
"""

from __future__ import annotations

import ast
import linecache
from pathlib import Path

import nbformat
import pytest
from IPython.core.inputtransformer2 import TransformerManager

import ddp_lab.exercises as ex
from ddp_lab.exercises.registry import find
from ddp_lab.exercises.stubs import is_stub_source
from ddp_lab.tools.solved import defined_name, exercise_cells, solved_copy

NOTEBOOKS = sorted((Path(__file__).resolve().parents[2] / "notebooks").glob("*.ipynb"))


def _cells() -> list:
    cases = []
    for path in NOTEBOOKS:
        nb = nbformat.read(path, as_version=4)
        solved = solved_copy(nb)
        for index, name in exercise_cells(nb):
            shipped = imports_above(nb, index) + nb.cells[index].source
            cases.append(pytest.param(path, shipped, solved.cells[index].source,
                                      nb.cells[index + 1].source, name, id=name))
    return cases


def imports_above(nb, index: int) -> str:
    """The import statements of the code cells above cell ``index``, as source."""
    found = []
    for cell in nb.cells[:index]:
        if cell.cell_type != "code":
            continue
        source = TransformerManager().transform_cell(cell.source)  # magics, as IPython does
        found += [ast.get_source_segment(source, node) for node in ast.parse(source).body
                  if isinstance(node, (ast.Import, ast.ImportFrom))]
    return "".join(f"{line}\n" for line in found)


CELLS = _cells()


def run_cell(source: str, filename: str, entry: str):
    """What the cell binds to ``entry`` (the name its check cell passes to ``ex.check``),
    after running it the way IPython does."""
    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
    namespace = {"__name__": "__main__"}
    exec(compile(source, filename, "exec"), namespace)
    return namespace[entry]


def test_every_exercise_has_one_cell_in_its_own_notebook():
    found = [(case.values[0].stem, case.values[-1]) for case in CELLS]
    assert sorted(name for _, name in found) == sorted(ex.names())
    for stem, name in found:
        assert stem.startswith(name.split(".")[0] + "_"), (stem, name)
        assert find(name).notebook == stem, (stem, name)


@pytest.mark.parametrize("path, shipped, solved, check_cell, name", CELLS)
def test_the_shipped_cell_is_a_stub_that_its_check_calls_not_solved_yet(
        path, shipped, solved, check_cell, name):
    assert is_stub_source(shipped), f"{path.name}: {name}'s cell holds more than a stub"
    assert f'ex.check("{name}", {defined_name(shipped)})' in check_cell
    stub = run_cell(shipped, f"<{path.stem} {name} stub>", defined_name(shipped))
    assert ex.check(name, stub).startswith(f"{name}: {ex.NOT_SOLVED}.")


@pytest.mark.usefixtures("warm_fork_server")
@pytest.mark.timeout(240)
@pytest.mark.parametrize("path, shipped, solved, check_cell, name", CELLS)
def test_the_solved_cell_passes_its_check(path, shipped, solved, check_cell, name):
    """The reference, pasted as the cell's source and bound to the stub's name, runs on its
    own (its imports included) and passes the checker on 1-4 ranks."""
    answer = run_cell(solved, f"<{path.stem} {name} solved>", defined_name(shipped))
    assert answer.__name__ == ex.solution(name).__name__
    assert ex.check(name, answer).startswith(f"{name}: passed.")


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[path.stem for path in NOTEBOOKS])
def test_no_cell_after_a_check_uses_the_learners_function(path):
    """Why one run of each notebook suffices: past its check cell, no code uses what an
    exercise cell defines, so the solved notebook differs from the shipped one only in the
    exercise cells and what their checks print (test_the_solved_cell_passes_its_check)."""
    nb = nbformat.read(path, as_version=4)
    for index, name in exercise_cells(nb):
        entry = defined_name(nb.cells[index].source)
        users = [later for later, cell in enumerate(nb.cells[index + 2:], index + 2)
                 if cell.cell_type == "code" and entry in names_used(cell.source)]
        assert not users, f"{path.name}: cells {users} use {entry} ({name}'s answer)"


def names_used(source: str) -> set[str]:
    """The names a cell's code reads, in a line magic's Python too (``%time f(x)``)."""
    tree = ast.parse(TransformerManager().transform_cell(source))
    names = {node.id for node in ast.walk(tree) if isinstance(node, ast.Name)}
    for node in ast.walk(tree):
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                and node.func.attr in ("run_line_magic", "run_cell_magic")):
            try:
                names |= names_used(node.args[-1].value)
            except SyntaxError:
                pass  # the magic's argument is no Python (options, a shell line)
    return names


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[path.stem for path in NOTEBOOKS])
def test_every_notebook_has_an_exercise(path):
    names = [name for _, name in exercise_cells(nbformat.read(path, as_version=4))]
    assert names, f"{path.name} has no exercise cell (tag 'exercise', metadata 'exercise')"
