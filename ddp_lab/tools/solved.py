"""Solved mode: a notebook with every exercise cell replaced by the reference solution, so
that CI (``ddp-lab notebooks --solved``) proves that every check passes on a right answer,
while the shipped notebook proves that the stubs let it run top to bottom.

An exercise cell is a code cell tagged ``exercise`` whose metadata names its exercise
(``"exercise": "02.all_gather"``). Its replacement is the solution's own source
(``inspect.getsource``), bound to the stub's name, after the imports the solutions use.
"""

from __future__ import annotations

import ast
import copy
import inspect
import textwrap

# What a reference solution may use from its module's globals (kept to these on purpose).
SOLUTION_IMPORTS = ("import math\nimport torch\nimport torch.distributed as dist\n"
                    "import torch.nn.functional as F\nfrom torch import nn\n")


def cell_source(cell) -> str:
    """A cell's source as one string (nbformat keeps it as a string or a list of lines)."""
    source = cell.get("source", "")
    return "".join(source) if isinstance(source, list) else source


def exercise_cells(nb) -> list[tuple[int, str]]:
    """(cell index, exercise name) of every exercise cell, in order."""
    return [(i, cell.get("metadata", {}).get("exercise", ""))
            for i, cell in enumerate(nb["cells"])
            if "exercise" in cell.get("metadata", {}).get("tags", [])]


def defined_name(source: str) -> str:
    """The name of the last function or class a cell defines: the learner's entry point."""
    names = [node.name for node in ast.parse(source).body
             if isinstance(node, (ast.FunctionDef, ast.ClassDef))]
    if not names:
        raise ValueError(f"an exercise cell must define a function or a class:\n{source}")
    return names[-1]


def solution_source(name: str, bind_to: str) -> str:
    """The reference solution of exercise ``name`` as cell source, bound to ``bind_to``."""
    import ddp_lab.exercises as ex
    solution = ex.solution(name)
    source = textwrap.dedent(inspect.getsource(solution))
    binding = "" if solution.__name__ == bind_to else f"\n{bind_to} = {solution.__name__}\n"
    return f"# solved mode: ex.solution({name!r})\n{SOLUTION_IMPORTS}\n\n{source}{binding}"


def solved_copy(nb):
    """A copy of ``nb`` whose exercise cells hold the reference solutions."""
    solved = copy.deepcopy(nb)
    for index, name in exercise_cells(solved):
        if not name:
            raise ValueError(f"exercise cell {index} names no exercise in its metadata")
        cell = solved["cells"][index]
        cell["source"] = solution_source(name, defined_name(cell_source(cell)))
    return solved


def unsolved_checks(nb, marker: str) -> list[int]:
    """Indices of code cells whose output says ``marker`` ("not solved yet")."""
    found = []
    for index, cell in enumerate(nb["cells"]):
        texts = [output.get("text", "") for output in cell.get("outputs", [])]
        if any(marker in ("".join(t) if isinstance(t, list) else t) for t in texts):
            found.append(index)
    return found
