"""What a failed check keeps for the learner who asks: ``ex.last_failure()``.

A failed check says in a few lines what is wrong (:mod:`.feedback_values`,
:mod:`.feedback_traceback`); the evidence behind those lines (both full tensors, the rank's
whole traceback) is kept while the checker runs and handed over with the failure, so
nothing is lost by the short message::

    ex.check("02.shift", my_shift)   # ExerciseFailed: ... first difference at [0, 1] ...
    f = ex.last_failure()
    f.expected, f.got                # the full tensors that were compared
    print(f.traceback)               # a crash's traceback, every frame
"""

from __future__ import annotations

import contextlib
import contextvars
from dataclasses import dataclass, field
from typing import Any

from ddp_lab.exercises.registry import ExerciseFailed

_UNSET: Any = object()


@dataclass(frozen=True)
class Failure:
    """A failed check, whole: ``message`` is what the check said; ``expected`` and ``got``
    the values compared in full (None where the failure was no comparison); ``input`` the
    rank's own input where the checker named it; ``traceback`` a crash's full traceback, or
    a hang's full stacks ("" otherwise)."""

    name: str
    message: str
    expected: Any = None
    got: Any = None
    input: Any = None
    traceback: str = ""

    def __str__(self) -> str:
        parts = [f"{self.name} failed: {self.message}"]
        for label in ("expected", "got", "input"):
            value = getattr(self, label)
            if value is not None:
                parts.append(f"{label}:\n{value!r}")
        if self.traceback:
            parts.append(f"traceback:\n{self.traceback.rstrip()}")
        return "\n\n".join(parts)

    def _repr_pretty_(self, printer, cycle) -> None:
        """IPython shows the whole report, not the dataclass's one-line repr."""
        printer.text(str(self))


@dataclass
class _Evidence:
    """What the checker compared, kept while it runs: (the problem's words, its data)."""

    kept: list[tuple[str, dict]] = field(default_factory=list)


_COLLECTING: contextvars.ContextVar[_Evidence | None] = contextvars.ContextVar(
    "ddp_lab_exercise_evidence", default=None)


class _Memory:
    """The most recent failure in this interpreter, like ``sys.last_value``: the learner
    asks for it in the next cell, after the exception has been shown and dropped."""

    last: Failure | None = None


def last_failure() -> Failure | None:
    """The most recent failed check in this kernel, whole: ``.message``, ``.expected`` and
    ``.got`` (the full values the check compared), ``.input`` and ``.traceback`` (a crash's
    every frame). None while no check has failed."""
    return _Memory.last


def keep(problem: str | None, *, expected=_UNSET, got=_UNSET, input=_UNSET,
         traceback: str = "") -> str | None:
    """Record the data behind ``problem`` (the words a check may raise) while a check runs;
    returns ``problem`` so a formatter can end with ``return keep(words, ...)``. Outside a
    check, or for no problem, it records nothing."""
    evidence = _COLLECTING.get()
    if problem and evidence is not None:
        data = {k: v for k, v in (("expected", expected), ("got", got), ("input", input))
                if v is not _UNSET}
        if traceback:
            data["traceback"] = traceback
        evidence.kept.append((problem, data))
    return problem


@contextlib.contextmanager
def collecting():
    """Collect what :func:`keep` records during one check."""
    token = _COLLECTING.set(_Evidence())
    try:
        yield _COLLECTING.get()
    finally:
        _COLLECTING.reset(token)


def failed(name: str, message: str, evidence: _Evidence, recipe: bool) -> ExerciseFailed:
    """The check's ExerciseFailed: ``message``, then where the full data is and the recipe;
    the failure, with the evidence its message quotes, becomes :func:`last_failure`."""
    data: dict = {}
    for problem, kept in evidence.kept:
        if problem in message:
            data.update(kept)
    _Memory.last = Failure(name, message, **data)
    notes = []
    if {"expected", "got", "input"} & data.keys():
        notes.append("The full values: ex.last_failure() (.expected, .got).")
    if recipe:
        notes.append(f"Stuck? ex.recipe({name!r}) spells out the steps.")
    return ExerciseFailed("\n\n".join([message, "\n".join(notes)]) if notes else message)
