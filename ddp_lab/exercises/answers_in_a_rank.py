"""A pure function checked away from its expectation: the checker draws every input, one
rank (another process) calls the learner's function on each and returns its answers as plain
data, and the checker compares them with the expected answers, which never leave it.

Why not call the function in the checker's own process: there, its caller's frames and
memory hold the check's seed, the trials and the expected answers, and a function that reads them
(``sys._getframe(1).f_locals``, ``gc``) passes without solving anything. In the rank there is
nothing of them to find. Answers come back as plain data (``plain`` turns each into Python
numbers, strings, tuples, or a few words for anything else), so no object of the learner's
(a class whose ``__eq__`` says yes to everything) runs in the checker.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ddp_lab.course.collective_trace import BuiltinSwitchedOff
from ddp_lab.exercises.driver import run_ranks


def answers(fn, inputs: list[tuple], plain, *, where: str, guard=None) -> list[tuple]:
    """``("returned", plain(fn(*args)))`` or ``("raised", "ValueError('...')")`` for each
    ``args`` of ``inputs``, in order, up to the first that raised. ``guard()`` (a context
    manager, made in the rank) is held around each call: what the exercise switches off."""
    return run_ranks(_answer_each, 1, (fn, inputs, plain, guard), where=where)[0]


def _answer_each(fn, inputs, plain, guard) -> list[tuple]:
    got = []
    for args in inputs:
        try:
            if guard is None:
                value = fn(*args)
            else:
                with guard():
                    value = fn(*args)
        except (NotImplementedError, BuiltinSwitchedOff):
            raise  # "not solved yet", or a refusal the driver words
        except Exception as err:  # the checker says which input made it raise
            got.append(("raised", f"{type(err).__name__}({str(err)[:200]!r})"))
            return got
        got.append(("returned", plain(value)))
    return got


@dataclass(frozen=True)
class Other:
    """An answer of none of the plain kinds, as the checker sees it: its type's name and
    its text (``repr`` reads "str '3'")."""

    kind: str
    text: str

    def __repr__(self) -> str:
        return f"{self.kind} {self.text!r}"


def other(value) -> Other:
    try:
        text = str(value)[:60]
    except Exception:  # a learner's __str__ may raise; the type is enough then
        text = "?"
    return Other(type(value).__name__, text)


PLAIN = (type(None), bool, int, float, str)


def plain(value):
    """In the rank: ``value`` as plain data for the checker: Python numbers, strings and None
    as they are (a float subclass such as numpy.float64 as its float), a tensor as a plain
    tensor (a copy, of torch.Tensor itself), lists and tuples item by item, anything else (a
    subclass of these too) as :class:`Other`."""
    if type(value) in PLAIN:
        return value
    if isinstance(value, float):  # numpy.float64 and other float subclasses: their value
        return float.__float__(value)
    if type(value) is torch.Tensor:
        return value.detach().clone()
    if type(value) in (list, tuple):
        return type(value)(plain(item) for item in value)
    return other(value)
