"""Switching built-ins off while the learner's code runs, so an exercise that rebuilds a
collective cannot call the collective it rebuilds.

Collectives are refused where every path meets, the dispatcher
(:class:`ddp_lab.course.collective_trace.CollectiveTrace` with ``forbid``): ``dist.X``, a name
imported from torch.distributed, ``distributed_c10d.X``, the process-group object's methods
and the functional collectives all raise :class:`BuiltinSwitchedOff`, whose message names the
exercise's point. Anything else (``time.sleep``, a course function the exercise rebuilds) is
replaced on its module for the block. Everything is put back on leaving the ``with`` block,
even after an error.
"""

from __future__ import annotations

import contextlib
import importlib
from typing import Iterator

from ddp_lab.course.collective_trace import BuiltinSwitchedOff, CollectiveTrace

# Every collective of torch.distributed, by family: an exercise switches off the families
# it rebuilds (names missing from this torch are skipped).
# The single-tensor forms under torch 2.13's names (all_gather_single, reduce_scatter_single)
# and under the older ones that forward to them with a FutureWarning (all_gather_into_tensor,
# _all_gather_base, reduce_scatter_tensor, _reduce_scatter_base): all reach the same c10d op.
ALL_GATHERS = ("all_gather", "all_gather_single", "all_gather_into_tensor", "all_gather_object",
               "all_gather_coalesced", "_all_gather_base")
GATHERS = ALL_GATHERS + ("gather", "gather_object")
REDUCE_SCATTERS = ("reduce_scatter", "reduce_scatter_single", "reduce_scatter_tensor",
                   "_reduce_scatter_base")
REDUCTIONS = ("all_reduce", "all_reduce_coalesced", "reduce") + REDUCE_SCATTERS
BROADCASTS = ("broadcast", "broadcast_object_list")
SCATTERS = ("scatter", "scatter_object_list")
ALL_TO_ALLS = ("all_to_all", "all_to_all_single")
COLLECTIVES = GATHERS + REDUCTIONS + BROADCASTS + SCATTERS + ALL_TO_ALLS


# The names above by the family the dispatcher knows them by (object collectives and the
# coalesced and tensor forms run the family's c10d op).
FAMILY = {name: family for family, names in (
    ("all_gather", ALL_GATHERS), ("gather", ("gather", "gather_object")),
    ("all_reduce", ("all_reduce", "all_reduce_coalesced")), ("reduce", ("reduce",)),
    ("reduce_scatter", REDUCE_SCATTERS),
    ("broadcast", BROADCASTS), ("scatter", SCATTERS), ("all_to_all", ALL_TO_ALLS),
    ("barrier", ("barrier", "monitored_barrier")),
    ("send", ("send", "isend")), ("recv", ("recv", "irecv"))) for name in names}


def refusing(qualified: str, why: str):
    """A stand-in for ``qualified`` (e.g. ``"dist.all_gather"``) that always refuses."""
    def refuse(*args, **kwargs):
        raise BuiltinSwitchedOff(f"{qualified} is switched off in this exercise: {why}")
    refuse.__name__ = qualified.rsplit(".", 1)[-1]
    return refuse


@contextlib.contextmanager
def switched_off(names, why: str, module: str = "torch.distributed") -> Iterator[None]:
    """Inside the block, each of ``names`` on ``module`` refuses with ``why``.

    For ``torch.distributed`` the refusal is at the dispatcher, by family (``all_gather``
    switches off every form of the all-gather, however it is reached; ``batch_isend_irecv``
    is the send and recv families).
    """
    if module == "torch.distributed":
        with CollectiveTrace(forbid=families(names), why=why):
            yield
        return
    targets = [importlib.import_module(module)]
    short = module
    with contextlib.ExitStack() as stack:
        for name in names:
            stand_in = refusing(f"{short}.{name}", why)
            for target in targets:
                if hasattr(target, name):
                    stack.enter_context(_replaced(target, name, stand_in))
        yield


def families(names) -> set[str]:
    """The dispatcher families of torch.distributed names (``isend`` -> ``send``). A variant
    alone (``all_reduce_coalesced``, ``scatter_object_list``) forbids nothing: it runs its
    family's op, which an exercise that lists every name but ``all_reduce`` still wants."""
    found = set()
    for name in names:
        if name == "batch_isend_irecv":
            found |= {"send", "recv"}
        elif name not in FAMILY:
            raise ValueError(f"no collective family for torch.distributed.{name}")
        elif FAMILY[name] in names or FAMILY[name] in ("send", "recv"):
            found.add(FAMILY[name])
    return found


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


@contextlib.contextmanager
def refused_everywhere(function, qualified: str, why: str) -> Iterator[None]:
    """Inside the block, the Python function ``function`` (a course or scratch function the
    exercise rebuilds) refuses with ``why`` however it is reached: under its module's name,
    imported under another (``from ddp_lab.scratch.moe import dispatch`` at the top of a
    notebook), or through a class. Replacing the module attribute, as :func:`switched_off`
    does for other modules, misses the imported names; here the function object itself
    changes: its code is swapped for code that raises, and put back on leaving the block."""
    if function.__code__.co_freevars:
        raise ValueError(f"{qualified} is a closure: its code cannot be swapped")
    original = function.__code__
    function.__code__ = _refusing_code(f"{qualified} is switched off in this exercise, "
                                       f"however it is imported: {why}", original.co_name)
    try:
        yield
    finally:
        function.__code__ = original


def _refusing_code(message: str, name: str):
    """Code that raises BuiltinSwitchedOff(message) whatever it is called with; it resolves
    the exception class by import, since it runs with the swapped function's globals."""
    def template(*args, **kwargs):
        raise __import__("ddp_lab.course.collective_trace",
                         fromlist=["BuiltinSwitchedOff"]).BuiltinSwitchedOff("MESSAGE")
    code = template.__code__
    return code.replace(co_name=name, co_consts=tuple(
        message if constant == "MESSAGE" else constant for constant in code.co_consts))
