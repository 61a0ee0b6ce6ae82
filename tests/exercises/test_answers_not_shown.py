"""No notebook gives an exercise's answer away above its stub cell.

What a reader has seen by the time they reach the stub is the source of every cell above it
(code cells, and code blocks in markdown) and what those cells print; the course prints code with ``inspect.getsource``. So, for every
exercise cell, this test collects the code above it (the cells, and the source of every
object a cell above passes to ``inspect.getsource``) and checks three things:

1. the reference solution's body (``ex.solution(name)``, docstring and comments dropped,
   normalized by ``ast.unparse``) does not appear there line for line;
2. no shown function is a near copy of it: with names, numbers and strings abstracted away,
   at most ``NEAR_COPY`` of the reference's tokens fall in runs shared with one shown
   function (a renamed copy of the answer scores about 1.0; sharing idioms such as
   ``rank, world = dist.get_rank(), dist.get_world_size()`` stays far below);
3. no cell above prints the source of what the exercise declares answers it
   (``Exercise.answered_by``: the chapter or scratch code that does the same job under other
   names, which only a person can recognise).
"""

from __future__ import annotations

import ast
import builtins
import difflib
import importlib
import inspect
import io
import keyword
import re
import textwrap
import tokenize
from pathlib import Path

import nbformat
import pytest

import ddp_lab.exercises as ex
from ddp_lab.exercises.registry import find
from ddp_lab.tools.solved import exercise_cells

NOTEBOOKS = sorted((Path(__file__).resolve().parents[2] / "notebooks").glob("*.ipynb"))
NEAR_COPY = 0.8
_KEPT_NAMES = set(dir(builtins))


def _python(source: str) -> str:
    """A cell's Python: IPython's line and cell magics (``%...``) left out."""
    return "\n".join(line for line in source.splitlines() if not line.lstrip().startswith("%"))


def _without_docstrings(tree: ast.AST) -> ast.AST:
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if (isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
                and body and isinstance(body[0], ast.Expr)
                and isinstance(body[0].value, ast.Constant)
                and isinstance(body[0].value.value, str)):
            node.body = body[1:] or [ast.Pass()]
    return tree


def _parse(source: str) -> ast.Module | None:
    try:
        return _without_docstrings(ast.parse(textwrap.dedent(_python(source))))
    except SyntaxError:
        return None


def _functions(source: str) -> list[str]:
    """The whole code and each function body in it, normalized (ast.unparse)."""
    tree = _parse(source)
    if tree is None:
        return []
    return [ast.unparse(tree)] + [ast.unparse(ast.Module(node.body, []))
                                  for node in ast.walk(tree)
                                  if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))]


def _lines(code: str) -> list[str]:
    return [line.strip() for line in code.splitlines() if line.strip()]


def _skeleton(code: str) -> list[str]:
    """Tokens with every name that is not a keyword, builtin or attribute replaced by ``_``,
    and every literal by ``#``: what stays when a copy renames its variables."""
    out, previous = [], None
    skipped = (tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT,
               tokenize.COMMENT, tokenize.ENDMARKER)
    for token in tokenize.generate_tokens(io.StringIO(code).readline):
        if token.type in skipped:
            continue
        text = token.string
        if (token.type == tokenize.NAME and not keyword.iskeyword(text)
                and text not in _KEPT_NAMES and previous != "."):
            text = "_"
        elif token.type in (tokenize.NUMBER, tokenize.STRING):
            text = "#"
        out.append(text)
        previous = token.string
    return out


def _shared(reference: list[str], shown: list[str]) -> float:
    """The share of ``reference``'s tokens in runs of 4 or more that ``shown`` also has."""
    matcher = difflib.SequenceMatcher(None, reference, shown, autojunk=False)
    return sum(b.size for b in matcher.get_matching_blocks() if b.size >= 4) / len(reference)


def _reference_body(name: str) -> str:
    node = _parse(inspect.getsource(ex.solution(name))).body[0]
    return ast.unparse(ast.Module(node.body, []))


def _qualified(obj) -> str:
    """``module:Qualified.name`` of a shown object (``module:`` for a whole module)."""
    if inspect.ismodule(obj):
        return f"{obj.__name__}:"
    obj = inspect.unwrap(obj)
    return f"{obj.__module__}:{obj.__qualname__}"


def _covers(shown: str, answer: str) -> bool:
    """Showing ``shown`` shows ``answer``: the same object, or a module or class holding it."""
    module, _, qualname = shown.partition(":")
    answer_module, _, answer_qualname = answer.partition(":")
    return module == answer_module and (
        not qualname or answer_qualname == qualname or answer_qualname.startswith(qualname + "."))


def _binds_a_module(node: ast.stmt) -> bool:
    """An import, or ``name = importlib.import_module("...")``: what a cell binds that a
    later ``inspect.getsource(name.attr)`` needs, without running anything else."""
    if isinstance(node, (ast.Import, ast.ImportFrom)):
        return True
    return (isinstance(node, ast.Assign) and isinstance(node.value, ast.Call)
            and ast.unparse(node.value.func) == "importlib.import_module")


def _shown_above(cells) -> list[tuple[str, str]]:
    """(where, source) of everything the cells show: each code cell, each code block of a
    markdown cell, and each object a cell passes to ``inspect.getsource`` (evaluated after
    the top-level imports so far)."""
    namespace: dict = {}
    shown = []
    for index, cell in enumerate(cells):
        if cell.cell_type == "markdown":
            shown += [(f"cell {index} (markdown)", block)
                      for block in re.findall(r"```(?:python)?\n(.*?)```", cell.source, re.S)]
        if cell.cell_type != "code":
            continue
        shown.append((f"cell {index}", cell.source))
        tree = _parse(cell.source)
        if tree is None:
            continue
        imports = [node for node in tree.body if _binds_a_module(node)]
        exec(compile(ast.Module(imports, []), f"<cell {index} imports>", "exec"), namespace)
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and ast.unparse(node.func) == "inspect.getsource":
                obj = eval(ast.unparse(node.args[0]), namespace)  # noqa: S307 (our notebooks)
                shown.append((f"cell {index}: getsource {_qualified(obj)}",
                              inspect.getsource(obj)))
    return shown


def _cases() -> list:
    cases = []
    for path in NOTEBOOKS:
        nb = nbformat.read(path, as_version=4)
        for index, name in exercise_cells(nb):
            cases.append(pytest.param(path, index, name, id=name))
    return cases


@pytest.mark.parametrize("path, index, name", _cases())
def test_no_cell_above_the_stub_shows_the_answer(path, index, name):
    nb = nbformat.read(path, as_version=4)
    reference = _reference_body(name)
    reference_lines, reference_skeleton = _lines(reference), _skeleton(reference)
    for where, source in _shown_above(nb.cells[:index]):
        for function in _functions(source):
            lines = _lines(function)
            assert not any(lines[i:i + len(reference_lines)] == reference_lines
                           for i in range(len(lines))), \
                f"{path.name} {where} shows {name}'s reference solution above its stub"
            share = _shared(reference_skeleton, _skeleton(function))
            assert share < NEAR_COPY, (
                f"{path.name} {where} shows a near copy of {name}'s reference solution above "
                f"its stub ({share:.0%} of its tokens):\n{function}")
        printed = where.partition("getsource ")[2]
        for answer in find(name).answered_by:
            assert not (printed and _covers(printed, answer)), \
                f"{path.name} {where} prints {answer}, which answers {name}: show it after the check"


def test_answered_by_names_real_code():
    for name in ex.names():
        for answer in find(name).answered_by:
            module, _, qualname = answer.partition(":")
            obj = importlib.import_module(module)
            for part in qualname.split("."):
                obj = getattr(obj, part)
            assert inspect.getsource(obj), answer


def test_the_checks_catch_a_printed_answer():
    """The three checks on made-up cells: the reference verbatim, renamed, and declared."""
    body = _reference_body("10.shard_gradient")
    renamed = re.sub(r"\bworld\b", "n", re.sub(r"\bflat\b", "padded", body))
    assert _lines(body) == _lines(_functions(f"def f(full_grad):\n{textwrap.indent(body, '    ')}")[1])
    assert _shared(_skeleton(body), _skeleton(renamed)) == 1.0
    idiom = "rank, world = dist.get_rank(), dist.get_world_size()\nreturn rank"
    assert _shared(_skeleton(body), _skeleton(idiom)) < NEAR_COPY
    markdown = nbformat.v4.new_markdown_cell(f"Like this:\n```python\n{body}\n```\n")
    getsource = nbformat.v4.new_code_cell("import inspect\nfrom ddp_lab.scratch import fsdp\n"
                                          "print(inspect.getsource(fsdp._GatherParam))")
    shown = _shown_above([markdown, getsource])
    assert [where for where, _ in shown] == [
        "cell 0 (markdown)", "cell 1", "cell 1: getsource ddp_lab.scratch.fsdp:_GatherParam"]
    assert _lines(_functions(shown[0][1])[0]) == _lines(body)
    assert _covers("ddp_lab.scratch.fsdp:_GatherParam", "ddp_lab.scratch.fsdp:_GatherParam.backward")
    assert _covers("ddp_lab.scratch.fsdp:", "ddp_lab.scratch.fsdp:FSDP.sync_gradients")
    assert not _covers("ddp_lab.scratch.fsdp:FSDP._pack", "ddp_lab.scratch.fsdp:FSDP.sync_gradients")
