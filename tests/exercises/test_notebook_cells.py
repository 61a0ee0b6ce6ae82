"""The notebooks' exercise cells and the registry agree: every exercise has exactly one
stub cell, tagged and named in its metadata, followed by its check cell; the shipped cells
are stubs; solved mode swaps in a reference that defines the stub's name."""

from __future__ import annotations

from pathlib import Path

import nbformat
import pytest

import ddp_lab.exercises as ex
from ddp_lab.exercises.registry import find
from ddp_lab.exercises.stubs import is_stub, is_stub_source
from ddp_lab.tools.solved import defined_name, exercise_cells, solved_copy

NOTEBOOKS = sorted((Path(__file__).resolve().parents[2] / "notebooks").glob("*.ipynb"))


def _cells():
    for path in NOTEBOOKS:
        nb = nbformat.read(path, as_version=4)
        for index, name in exercise_cells(nb):
            yield path, nb, index, name


def test_every_exercise_has_one_cell_in_its_own_notebook():
    found = [(path.stem, name) for path, _, _, name in _cells()]
    assert sorted(name for _, name in found) == sorted(ex.names())
    for stem, name in found:
        assert stem.startswith(name.split(".")[0] + "_"), (stem, name)


@pytest.mark.parametrize("path, nb, index, name", list(_cells()),
                         ids=[name for *_, name in _cells()])
def test_the_shipped_cell_is_a_stub_and_the_next_cell_checks_it(path, nb, index, name):
    source = nb.cells[index].source
    assert is_stub_source(source), f"{path.name} cell {index} holds more than a stub"
    assert f'ex.check("{name}", {defined_name(source)})' in nb.cells[index + 1].source


def test_solved_mode_puts_each_reference_under_the_stub_name():
    for path in NOTEBOOKS:
        nb = nbformat.read(path, as_version=4)
        solved = solved_copy(nb)
        for index, name in exercise_cells(nb):
            stub_name = defined_name(nb.cells[index].source)
            namespace: dict = {}
            exec(compile(solved.cells[index].source, name, "exec"), namespace)
            assert not is_stub(ex.solution(name))
            assert namespace[stub_name].__name__ == ex.solution(name).__name__, name


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[path.stem for path in NOTEBOOKS])
def test_every_notebook_has_an_exercise(path):
    names = [name for _, name in exercise_cells(nbformat.read(path, as_version=4))]
    assert names, f"{path.name} has no exercise cell (tag 'exercise', metadata 'exercise')"
    assert all(find(name).notebook == path.stem for name in names), names
