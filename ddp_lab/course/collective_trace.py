"""Which collectives ran, on how many bytes, with whom: a TorchDispatchMode that sees every
collective at the level everything passes through, the dispatcher. ``dist.all_reduce``, the
same name imported (``from torch.distributed import all_reduce``), ``distributed_c10d.X``,
the process-group object's own methods (``_get_default_group().allreduce(...)``: torch's
``ProcessGroup`` calls the ``c10d::allreduce_`` op, torch/csrc/distributed/c10d/ProcessGroup.hpp)
and the functional collectives that DTensor and FSDP2 use (``_c10d_functional::all_reduce``,
which issues ``c10d::allreduce_`` in turn) all reach it. torch's own ``CommDebugMode``
(torch/distributed/tensor/debug/_comm_mode.py) counts calls the same way; this one also
records bytes, dtypes and point-to-point peers, and can refuse a family of collectives
before it runs (the exercises switch off what they ask the learner to build). DDP's Reducer
is seen too: its default all-reduce reaches the dispatcher as ``c10d::allreduce_`` (checked
in tests/course/test_sharding.py, one call per bucket).

The mode is per thread: it watches the thread that enters it, where autograd's backward on
CPU runs too (collectives issued in backward are counted), and a callback chained on a
Future (``.then``), on whatever thread torch runs it (``_follow_future_callbacks``). An op on a
DTensor is watched through what DTensor makes of it (the trace defers to the subclass and sees
the collectives it issues). Each call is recorded once, as the op the caller reached: the
``c10d`` op a functional collective issues runs
inside this mode's handler, where the mode is off.
"""

from __future__ import annotations

import copy
import threading
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch.distributed._functional_collectives import AsyncCollectiveTensor
from torch.distributed.distributed_c10d import _resolve_process_group
from torch.distributed.tensor import DTensor
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

NAMESPACES = ("c10d", "_c10d_functional", "c10d_functional", "_c10d_functional_autograd")
FUNCTIONAL = ("_c10d_functional", "c10d_functional", "_c10d_functional_autograd")
# Ops in those namespaces that move no data of their own.
NOT_COLLECTIVES = {"wait_tensor", "_wrap_tensor_autograd"}
ALL_REDUCES = {"allreduce_", "allreduce_coalesced_", "all_reduce", "all_reduce_coalesced"}

# Every op name, c10d's and the functional ones, by the family a learner knows it by.
FAMILIES = {
    "all_reduce": ("allreduce_", "allreduce_coalesced_", "all_reduce", "all_reduce_coalesced"),
    "all_gather": ("allgather_", "_allgather_base_", "allgather_coalesced_",
                   "allgather_into_tensor_coalesced_", "all_gather_into_tensor",
                   "all_gather_into_tensor_coalesced", "all_gather_into_tensor_out"),
    "reduce_scatter": ("reduce_scatter_", "_reduce_scatter_base_",
                       "reduce_scatter_tensor_coalesced_", "reduce_scatter_tensor",
                       "reduce_scatter_tensor_coalesced"),
    "broadcast": ("broadcast_", "broadcast"),
    "reduce": ("reduce_",),
    "gather": ("gather_",),
    "scatter": ("scatter_",),
    "all_to_all": ("alltoall_", "alltoall_base_", "all_to_all_single"),
    "barrier": ("barrier", "monitored_barrier_"),
    "send": ("send",),
    "recv": ("recv_", "recv_any_source_"),
}
FAMILY_OF = {op: family for family, ops in FAMILIES.items() for op in ops}
POINT_TO_POINT = ("send", "recv")
COLLECTIVE_FAMILIES = tuple(f for f in FAMILIES if f not in POINT_TO_POINT + ("barrier",))


DEFER_TO = (DTensor, AsyncCollectiveTensor)


class BuiltinSwitchedOff(RuntimeError):
    """The learner's code called something the exercise asks them to build themselves."""


@dataclass(frozen=True)
class CollectiveCall:
    """One collective: its op name (``all_gather_into_tensor``), the bytes of the full tensor
    it concerns (the larger of what goes in and what comes out), its group's size, the dtype
    of that tensor, and for a send or recv the other side's global rank (None: any source).
    ``whole_nbytes`` counts a list form's list whole: ``all_gather(tensor_list, t)``'s
    output is n tensors and ``nbytes`` holds the largest one, ``whole_nbytes`` their sum (for
    the tensor forms the two agree); a checker that judges cost by bytes reads it, so that an
    ``all_to_all`` of whole tensors is not counted as one of them."""

    name: str
    nbytes: int
    group_size: int
    dtype: torch.dtype | None = None
    peer: int | None = None
    functional: bool = False
    whole_nbytes: int = 0

    @property
    def family(self) -> str:
        """What a learner calls it: ``all_gather`` for ``_allgather_base_`` and the rest."""
        return FAMILY_OF.get(self.name, self.name)

    @property
    def bytes_per_rank(self) -> float:
        """Bytes each rank sends with a ring algorithm: an all-reduce is a reduce-scatter
        plus an all-gather, 2 (n-1)/n of the tensor; the others move (n-1)/n of it (a
        broadcast: on average over the ranks). A send moves its tensor; a recv, a barrier
        nothing of this rank's."""
        if self.family == "send":
            return float(self.nbytes)
        if self.family in ("recv", "barrier"):
            return 0.0
        n = self.group_size
        return self.nbytes * (n - 1) / n * (2 if self.name in ALL_REDUCES else 1)


# TorchDispatchMode's per-instance stacks of saved flags (torch/utils/_python_dispatch.py):
# a follower gets its own.
FLAG_STACKS = ("old_dispatch_mode_flags", "old_non_infra_dispatch_mode_flags",
               "old_without_ignore_compile_internals_dispatch_mode_flags")


def _follow_future_callbacks(trace: "CollectiveTrace"):
    """While ``trace`` is on, a callback given to ``Future.then`` or ``add_done_callback``
    runs watched: torch runs it on the thread that completes the future (gloo's worker
    thread, when the collective is still going: PowerSGD's hook issues its all-reduces from
    such callbacks, torch/distributed/algorithms/ddp_comm_hooks/powerSGD_hook.py), where the
    mode, a per-thread stack, is not. Returns what puts the methods back."""
    original_then, original_add = torch._C.Future.then, torch._C.Future.add_done_callback

    def then(future, callback):
        return original_then(future, _watched(trace, callback))

    def add_done_callback(future, callback):
        return original_add(future, _watched(trace, callback))

    torch._C.Future.then, torch._C.Future.add_done_callback = then, add_done_callback

    def restore():
        torch._C.Future.then, torch._C.Future.add_done_callback = original_then, original_add
    return restore


def _watched(trace: "CollectiveTrace", callback):
    def run(future):
        if threading.get_ident() == trace._owner:  # inline, where the trace is on already
            return callback(future)
        with trace.follower():
            return callback(future)
    return run


def _short(func) -> str:
    return func.__name__.split(".")[0]


def _list_bytes(args) -> int:
    """The bytes of the largest tensor-list argument, its tensors summed (c10d's list forms
    take ``Tensor[]`` or ``Tensor[][]``: all_gather's output list, reduce_scatter's input)."""
    lists = [a for a in args if isinstance(a, (list, tuple))]
    return max((sum(t.numel() * t.element_size() for t in tree_leaves(a)
                    if isinstance(t, torch.Tensor)) for a in lists), default=0)


class CollectiveTrace(TorchDispatchMode):
    """``with CollectiveTrace() as trace: ...``; then ``trace.calls`` (in order),
    ``trace.counts()`` and ``trace.total_bytes()``; ``world_size`` is the group size of an
    op that names no group (default: the default group's). ``forbid`` names families
    (``"all_gather"``, ``"send"``...) that raise :class:`BuiltinSwitchedOff` with ``why``
    instead of running."""

    def __init__(self, world_size: int | None = None, *, forbid=(), why: str = ""):
        super().__init__()
        unknown = set(forbid) - set(FAMILIES)
        if unknown:
            raise ValueError(f"unknown collective families {sorted(unknown)}; "
                             f"known: {', '.join(FAMILIES)}")
        self.world_size = world_size if world_size is not None else dist.get_world_size()
        self.forbid, self.why = frozenset(forbid), why
        self.calls: list[CollectiveCall] = []
        self._owner = None        # the thread that entered the trace
        self._restore = None      # puts Future's callback methods back
        self._following = False   # a copy that watches a callback's thread

    def __enter__(self):
        entered = super().__enter__()
        self._owner = threading.get_ident()
        if not self._following:
            self._restore = _follow_future_callbacks(self)
        return entered

    def __exit__(self, *exc_info):
        if self._restore is not None:
            self._restore()
            self._restore = None
        return super().__exit__(*exc_info)

    def follower(self) -> CollectiveTrace:
        """The same trace for another thread: it records into the same ``calls`` and refuses
        the same families (a mode is entered per thread; this copy has its own stack state)."""
        follower = copy.copy(self)
        for name in FLAG_STACKS:
            follower.__dict__.pop(name, None)
        follower._following, follower._restore = True, None
        return follower

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if isinstance(func, torch._ops.HigherOrderOperator):
            return func(*args, **(kwargs or {}))
        if any(issubclass(t, DEFER_TO) for t in types):
            # A DTensor turns this op into collectives of its own (an asynchronous result
            # waits for its collective first): defer to it, staying on the stack, so those
            # come back here as plain ops (what torch's CommDebugMode does, _comm_mode.py).
            return NotImplemented
        namespace = getattr(func, "namespace", "")
        watched = namespace in NAMESPACES and _short(func) not in NOT_COLLECTIVES
        if watched and FAMILY_OF.get(_short(func)) in self.forbid:
            raise BuiltinSwitchedOff(f"dist.{FAMILY_OF[_short(func)]} is switched off in this "
                                     f"exercise, in every form ({_short(func)} reached it): "
                                     f"{self.why}")
        out = func(*args, **(kwargs or {}))
        if watched:
            self.calls.append(self._call(func, args, kwargs, out, namespace in FUNCTIONAL))
        return out

    def _call(self, func, args, kwargs, out, functional: bool) -> CollectiveCall:
        tensors = [t for t in tree_leaves((args, kwargs, out)) if isinstance(t, torch.Tensor)]
        biggest = max(tensors, key=lambda t: t.numel() * t.element_size(), default=None)
        nbytes = 0 if biggest is None else biggest.numel() * biggest.element_size()
        if _short(func) == "barrier":
            nbytes, biggest = 0, None  # gloo's barrier takes a placeholder tensor
        return CollectiveCall(_short(func), nbytes, self._group_size(func, args),
                              None if biggest is None else biggest.dtype,
                              self._peer(func, args), functional,
                              whole_nbytes=0 if nbytes == 0 else max(nbytes, _list_bytes(args)))

    def _arguments(self, func, args) -> dict:
        return {argument.name: value for argument, value in zip(func._schema.arguments, args)}

    def _group_size(self, func, args) -> int:
        """The size of the group the op ran on, from its process-group argument (c10d ops
        carry the ProcessGroup itself, functional ones its registered name)."""
        named = self._arguments(func, args)
        if "process_group" in named:
            return dist.ProcessGroup.unbox(named["process_group"]).size()
        if "group_name" in named:
            return _resolve_process_group(named["group_name"]).size()
        return self.world_size

    def _peer(self, func, args) -> int | None:
        """A send's destination or a recv's source as a global rank (the c10d op carries
        the group's own rank: ``c10d::send(tensors, process_group, dst, tag)``)."""
        named = self._arguments(func, args)
        local = named.get("dst", named.get("src"))
        if local is None or "process_group" not in named:
            return None  # no peer; a functional broadcast's ``src`` is its root, by group name
        group = dist.ProcessGroup.unbox(named["process_group"])
        try:
            return dist.get_global_rank(group, local)
        except (ValueError, RuntimeError):  # a group torch's registry does not know
            return local

    def of(self, *families: str) -> list[CollectiveCall]:
        """The calls of these families, in order."""
        return [call for call in self.calls if call.family in families]

    def moving_data(self) -> list[CollectiveCall]:
        """Every record but barriers and receives from any source (what the course's
        traffic figures count)."""
        return [call for call in self.calls
                if call.family != "barrier" and call.name != "recv_any_source_"]

    def counts(self) -> dict[str, int]:
        """Records per op name, functional and c10d alike (barriers left out)."""
        found: dict[str, int] = {}
        for call in self.moving_data():
            found[call.name] = found.get(call.name, 0) + 1
        return found

    def family_counts(self) -> dict[str, int]:
        """Calls per family, barriers included: ``{"all_reduce": 2, "send": 3}``."""
        found: dict[str, int] = {}
        for call in self.calls:
            found[call.family] = found.get(call.family, 0) + 1
        return found

    def total_bytes(self) -> int:
        return sum(call.nbytes for call in self.moving_data())

    def bytes_per_rank(self) -> float:
        return sum(call.bytes_per_rank for call in self.moving_data())
