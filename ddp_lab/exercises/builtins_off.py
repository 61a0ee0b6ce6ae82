"""Switching built-ins off while the learner's code runs, so an exercise that rebuilds a
collective cannot call the collective it rebuilds.

The refusing stand-ins replace the names both on ``torch.distributed`` (what learners call)
and on ``torch.distributed.distributed_c10d`` (where torch's own helpers look them up), and
raise :class:`BuiltinSwitchedOff`, whose message names the exercise's point. Everything is
put back on leaving the ``with`` block, even after an error.
"""

from __future__ import annotations

import contextlib
import importlib
from typing import Iterator

# Every collective of torch.distributed, by family: an exercise switches off the families
# it rebuilds (names missing from this torch are skipped).
GATHERS = ("all_gather", "all_gather_into_tensor", "all_gather_object", "all_gather_coalesced",
           "gather", "gather_object", "_all_gather_base")
REDUCTIONS = ("all_reduce", "all_reduce_coalesced", "reduce", "reduce_scatter",
              "reduce_scatter_tensor", "_reduce_scatter_base")
BROADCASTS = ("broadcast", "broadcast_object_list")
SCATTERS = ("scatter", "scatter_object_list")
ALL_TO_ALLS = ("all_to_all", "all_to_all_single")
COLLECTIVES = GATHERS + REDUCTIONS + BROADCASTS + SCATTERS + ALL_TO_ALLS


class BuiltinSwitchedOff(RuntimeError):
    """The learner's code called something the exercise asks them to build themselves."""


def refusing(qualified: str, why: str):
    """A stand-in for ``qualified`` (e.g. ``"dist.all_gather"``) that always refuses."""
    def refuse(*args, **kwargs):
        raise BuiltinSwitchedOff(f"{qualified} is switched off in this exercise: {why}")
    refuse.__name__ = qualified.rsplit(".", 1)[-1]
    return refuse


@contextlib.contextmanager
def switched_off(names, why: str, module: str = "torch.distributed") -> Iterator[None]:
    """Inside the block, each of ``names`` on ``module`` refuses with ``why``.

    For ``torch.distributed`` the same stand-in also goes on ``distributed_c10d``, so
    ``dist.all_gather`` and torch-internal calls of it are both off.
    """
    targets = [importlib.import_module(module)]
    if module == "torch.distributed":
        targets.append(importlib.import_module("torch.distributed.distributed_c10d"))
    short = "dist" if module == "torch.distributed" else module
    with contextlib.ExitStack() as stack:
        for name in names:
            stand_in = refusing(f"{short}.{name}", why)
            for target in targets:
                if hasattr(target, name):
                    stack.enter_context(_replaced(target, name, stand_in))
        yield


@contextlib.contextmanager
def replaced(target, name: str, value) -> Iterator[None]:
    """``target.name = value`` for the duration of the block (a patch of our own, so the
    checkers depend on no test library)."""
    with _replaced(target, name, value):
        yield


@contextlib.contextmanager
def _replaced(target, name: str, value) -> Iterator[None]:
    original = getattr(target, name)
    setattr(target, name, value)
    try:
        yield
    finally:
        setattr(target, name, original)
