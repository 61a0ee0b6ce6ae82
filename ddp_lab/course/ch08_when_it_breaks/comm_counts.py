"""Notebook 08b: torch's own collective counter, ``CommDebugMode``
(torch/distributed/tensor/debug/_comm_mode.py), next to the course's ``CollectiveTrace``.

Both are TorchDispatchModes that see the c10d ops behind ``dist.all_reduce`` & co. and the
functional collectives of DTensor/FSDP2; ``CommDebugMode`` also attributes them to the
module that ran them (``generate_comm_debug_tracing_table``), ``CollectiveTrace`` adds the
bytes that notebooks 10 and 11 turn into traffic per rank. Run inside a rank.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch.distributed.tensor.debug import CommDebugMode

from ddp_lab.course.collective_trace import CollectiveTrace


def a_few_collectives(numel: int = 1000) -> None:
    """One all-reduce, one broadcast, one all-gather into a tensor."""
    t = torch.ones(numel)
    dist.all_reduce(t)
    dist.broadcast(t, src=0)
    dist.all_gather_single(torch.empty(numel * dist.get_world_size()), t)


def counted_both_ways(numel: int = 1000) -> dict:
    """The same collectives under both modes at once: what each counted."""
    with CommDebugMode() as torch_mode, CollectiveTrace(dist.get_world_size()) as course:
        a_few_collectives(numel)
    return {"CommDebugMode": {str(op): n for op, n in torch_mode.get_comm_counts().items()},
            "CommDebugMode total": torch_mode.get_total_counts(),
            "CollectiveTrace": course.counts(), "bytes per rank": course.bytes_per_rank()}
