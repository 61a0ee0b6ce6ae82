"""Which collectives ran, and on how many bytes: a TorchDispatchMode that sees every
collective that goes through the dispatcher, both the c10d ops behind ``dist.all_reduce``
& co. and the functional collectives that DTensor and FSDP2 use. torch's own
``CommDebugMode`` (torch/distributed/tensor/debug/_comm_mode.py) counts calls the same way;
this one also records the bytes, which the course turns into traffic per rank. DDP's
Reducer is seen too: its default all-reduce reaches the dispatcher as ``c10d::allreduce_``
(checked in tests/course/test_sharding.py, one call per bucket).

Only the calling thread is watched (dispatch modes are thread-local), and autograd's
backward on CPU runs there too, so collectives issued in backward are counted.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch.distributed.distributed_c10d import _resolve_process_group
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

NAMESPACES = ("c10d", "_c10d_functional", "c10d_functional", "_c10d_functional_autograd")
# Ops in those namespaces that move no data of their own.
NOT_COLLECTIVES = {"wait_tensor", "barrier", "monitored_barrier_", "recv_any_source_",
                   "_wrap_tensor_autograd"}
ALL_REDUCES = {"allreduce_", "allreduce_coalesced_", "all_reduce", "all_reduce_coalesced"}


@dataclass(frozen=True)
class CollectiveCall:
    """One collective: its name (``all_gather_into_tensor``), the bytes of the full tensor it
    concerns (the larger of what goes in and what comes out), and its group's size."""

    name: str
    nbytes: int
    group_size: int

    @property
    def bytes_per_rank(self) -> float:
        """Bytes each rank sends with a ring algorithm: an all-reduce is a reduce-scatter
        plus an all-gather, 2 (n-1)/n of the tensor; the others move (n-1)/n of it (a
        broadcast: on average over the ranks)."""
        n = self.group_size
        return self.nbytes * (n - 1) / n * (2 if self.name in ALL_REDUCES else 1)


def _short(func) -> str:
    return func.__name__.split(".")[0]


class CollectiveTrace(TorchDispatchMode):
    """``with CollectiveTrace() as trace: ...``; then ``trace.calls`` (in order),
    ``trace.counts()`` and ``trace.total_bytes()``; ``world_size`` is the group size of an
    op that names no group."""

    def __init__(self, world_size: int):
        super().__init__()
        self.world_size = world_size
        self.calls: list[CollectiveCall] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        namespace = func.namespace if hasattr(func, "namespace") else ""
        if namespace in NAMESPACES and _short(func) not in NOT_COLLECTIVES:
            tensors = [t for t in tree_leaves((args, kwargs, out)) if isinstance(t, torch.Tensor)]
            nbytes = max((t.numel() * t.element_size() for t in tensors), default=0)
            self.calls.append(CollectiveCall(_short(func), nbytes, self._group_size(func, args)))
        return out

    def _group_size(self, func, args) -> int:
        """The size of the group the op ran on, from its process-group argument (c10d ops
        carry the ProcessGroup itself, functional ones its registered name)."""
        for argument, value in zip(func._schema.arguments, args):
            if argument.name == "process_group":
                return dist.ProcessGroup.unbox(value).size()
            if argument.name == "group_name":
                return _resolve_process_group(value).size()
        return self.world_size

    def counts(self) -> dict[str, int]:
        found: dict[str, int] = {}
        for call in self.calls:
            found[call.name] = found.get(call.name, 0) + 1
        return found

    def total_bytes(self) -> int:
        return sum(call.nbytes for call in self.calls)

    def bytes_per_rank(self) -> float:
        return sum(call.bytes_per_rank for call in self.calls)
