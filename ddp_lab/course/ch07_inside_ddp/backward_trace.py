"""When each collective was issued, and whether autograd's backward was running then: the
course's one instrument (:class:`~ddp_lab.course.collective_trace.CollectiveTrace`, which sees
``dist.all_reduce``, imported names, process-group methods and functional collectives alike)
with two notes per call, for the DDP chapters' overlap questions.

``torch._C._current_graph_task_id()`` is -1 outside backward (FSDP2 asks it the same
question: torch/distributed/fsdp/_fully_shard/_fsdp_common.py:192), so a collective launched
from a gradient hook reads as in backward, and one launched from ``sync_gradients()`` after
it does not.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from ddp_lab.course.collective_trace import CollectiveCall, CollectiveTrace


@dataclass(frozen=True)
class Issued:
    """One collective: what it was (``call``), when it was issued (``time.time()``) and
    whether autograd's backward was running at that moment."""

    call: CollectiveCall
    at: float
    in_backward: bool

    @property
    def numel(self) -> int:
        dtype = self.call.dtype
        size = torch.empty((), dtype=dtype).element_size() if dtype is not None else 1
        return self.call.nbytes // size

    def summary(self) -> tuple:
        """(family, numel, dtype name): what two ranks compare to see the same order."""
        return (self.call.family, self.numel, str(self.call.dtype).replace("torch.", ""))


class BackwardTrace(CollectiveTrace):
    """``with BackwardTrace() as trace: loss.backward(); ddp.sync_gradients()``; then
    ``trace.issued``: an :class:`Issued` per collective, in order."""

    def __init__(self, world_size: int | None = None):
        super().__init__(world_size)
        self.issued: list[Issued] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        before, at = len(self.calls), time.time()
        in_backward = torch._C._current_graph_task_id() != -1
        out = super().__torch_dispatch__(func, types, args, kwargs)
        self.issued += [Issued(call, at, in_backward) for call in self.calls[before:]]
        return out

    def all_reduces(self) -> list[Issued]:
        return [issued for issued in self.issued if issued.call.family == "all_reduce"]
