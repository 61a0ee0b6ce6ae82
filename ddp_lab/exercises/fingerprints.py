"""Fingerprints of the reference solutions: code by value, wherever it was compiled, so a
copy of a reference is known for one (sealed.py refuses it inside the learner's call)."""

from __future__ import annotations

import importlib
import os
import types
from pathlib import Path

import hashlib


def reference_prints(exercise) -> dict[str, str]:
    """{fingerprint: what it is} of every exercise's reference solution and of this
    exercise's ``answered_by`` targets (each code object inside them too)."""
    from ddp_lab.exercises.registry import all_exercises
    prints: dict[str, str] = {}
    for other in all_exercises().values():
        _add_prints(other.solution, f"the reference solution of {other.name}", prints)
    for target in exercise.answered_by:
        _add_prints(_resolve(target), f"the course's {target.split(':')[-1]}", prints)
    return prints


def _resolve(target: str):
    module, _, qualified = target.partition(":")
    found = importlib.import_module(module)
    for part in qualified.split("."):
        found = getattr(found, part)
    return found


def _add_prints(obj, what: str, prints: dict) -> None:
    for code in codes_of(obj):
        prints.setdefault(fingerprint(code), what)


def codes_of(obj) -> list:
    """The code objects of a function, or of every function a class defines: whole
    functions only (a fingerprint covers the code nested in it). A comprehension or a lambda
    alone is too small to call anybody's: ``[torch.empty_like(t) for _ in range(n)]`` in a
    reference is also in many right answers."""
    if isinstance(obj, type):
        return [code for value in vars(obj).values() if not isinstance(value, type)
                for code in codes_of(_unwrapped(value))]
    code = getattr(obj, "__code__", None)
    return [code] if isinstance(code, types.CodeType) else []


def _unwrapped(value):
    """The function inside a staticmethod, classmethod or property."""
    for attribute in ("__func__", "fget"):
        inner = getattr(value, attribute, None)
        if isinstance(inner, types.FunctionType):
            return inner
    return value if isinstance(value, types.FunctionType) else None


def nested(code: types.CodeType):
    yield code
    for constant in code.co_consts:
        if isinstance(constant, types.CodeType):
            yield from nested(constant)


def fingerprint(code: types.CodeType) -> str:
    """A code object by value: its bytecode, names and constants (nested code by its own
    fingerprint), not where it was compiled: a copy under another file or line has it too.
    A leading string constant (the docstring) is left out."""
    consts = code.co_consts[1:] if code.co_consts[:1] and isinstance(code.co_consts[0], str) \
        else code.co_consts
    parts = (code.co_code, code.co_names, code.co_varnames, code.co_freevars, code.co_argcount,
             code.co_kwonlyargcount,
             tuple(fingerprint(c) if isinstance(c, types.CodeType) else repr(c) for c in consts))
    return hashlib.sha256(repr(parts).encode()).hexdigest()[:32]


PACKAGE = str(Path(__file__).resolve().parents[1])


def own_cell_code(code: types.CodeType) -> bool:
    """A reference pasted into a notebook cell is the learner's own code (solved mode does
    that): compiled from a cell (IPython's ``ipykernel_PID/...py`` or ``<...>`` names), not
    from the package's file and not by ``exec`` of a string (``<string>``)."""
    name = code.co_filename
    if name.startswith("<"):
        return name not in NOT_CELLS and not name.startswith("<frozen")
    return "/ipykernel_" in name and not os.path.realpath(name).startswith(PACKAGE)


NOT_CELLS = ("<string>", "<stdin>", "<unknown>")
