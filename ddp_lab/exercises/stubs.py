"""Telling a stub from an attempt, so a notebook shipped with stubs runs top to bottom.

A stub is a function whose body (after its docstring) is only ``...``, ``pass`` or
``raise NotImplementedError(...)``: what an exercise cell holds before the learner writes
anything. A class is a stub when every method it defines is one (the capstone's skeleton). A function whose source cannot be read (a lambda built at run time, a builtin) is
treated as an attempt and checked.
"""

from __future__ import annotations

import ast
import inspect
import textwrap


def is_stub(fn) -> bool:
    try:
        source = textwrap.dedent(inspect.getsource(fn))
    except (OSError, TypeError):
        return False
    return is_stub_source(source)


def is_stub_source(source: str) -> bool:
    """Whether the last function or class that ``source`` defines is a stub: for a
    function's own source, that function; for an exercise cell, its entry point."""
    try:
        tree = ast.parse(source)
    except SyntaxError:  # a lambda inside a larger expression: not a stub cell
        return False
    definitions = [n for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef,
                                                          ast.ClassDef))]
    return bool(definitions) and _is_stub_definition(definitions[-1])


def _is_stub_definition(node: ast.stmt) -> bool:
    if not isinstance(node, ast.ClassDef):
        return _body_is_empty(node.body)
    methods = [n for n in node.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]
    return bool(methods) and all(_body_is_empty(m.body) for m in methods)


def _body_is_empty(body: list[ast.stmt]) -> bool:
    if body and _is_docstring(body[0]):
        body = body[1:]
    return all(_is_placeholder(statement) for statement in body)


def _is_docstring(statement: ast.stmt) -> bool:
    return (isinstance(statement, ast.Expr) and isinstance(statement.value, ast.Constant)
            and isinstance(statement.value.value, str))


def _is_placeholder(statement: ast.stmt) -> bool:
    if isinstance(statement, ast.Pass):
        return True
    if isinstance(statement, ast.Expr) and isinstance(statement.value, ast.Constant):
        return statement.value.value is Ellipsis
    if isinstance(statement, ast.Raise) and statement.exc is not None:
        raised = statement.exc.func if isinstance(statement.exc, ast.Call) else statement.exc
        return isinstance(raised, ast.Name) and raised.id == "NotImplementedError"
    return False
