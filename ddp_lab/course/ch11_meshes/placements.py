"""DTensor placements and ``redistribute`` as collectives (notebook 11).

A DTensor is a global tensor described by a mesh and one placement per mesh dimension:
``Shard(d)`` (each rank holds a slice along dim d), ``Replicate()`` (each rank holds all of
it) or ``Partial()`` (each rank holds a term; the global tensor is their reduction, a sum
by default). ``redistribute`` changes the placement with at most one collective
(torch/distributed/tensor/_redistribute.py): Shard -> Replicate is an all-gather,
Partial -> Replicate an all-reduce, Partial -> Shard a reduce-scatter, Shard(i) ->
Shard(j) an all-to-all (on a CPU mesh: an all-gather and a local chunk,
``shard_dim_alltoall``), while Replicate -> Shard is only a local slice: no communication.
Replicate -> Partial is a local split too, which DTensor does internally, but
``redistribute`` refuses a Partial target ("redistributing to Partial is for internal use only!",
torch/distributed/tensor/_api.py:714-718).
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor, Partial, Replicate, Shard

from ddp_lab.course.collective_trace import CollectiveTrace

TRANSITIONS = (
    ("Shard(0) -> Replicate", Shard(0), Replicate()),
    ("Partial -> Replicate", Partial(), Replicate()),
    ("Partial -> Shard(0)", Partial(), Shard(0)),
    ("Shard(0) -> Shard(1)", Shard(0), Shard(1)),
    ("Replicate -> Shard(0)", Replicate(), Shard(0)),
)


def global_tensor(rows: int = 4, cols: int = 4) -> torch.Tensor:
    return torch.arange(rows * cols, dtype=torch.float32).reshape(rows, cols)


def make_dtensor(mesh, placement) -> DTensor:
    """The global tensor in ``placement``. For Partial, rank r holds ``global / n + r`` minus
    the mean of those offsets, summands that add up to the global tensor."""
    full = global_tensor()
    n, rank = dist.get_world_size(), dist.get_rank()
    if isinstance(placement, Partial):
        local = full / n + (rank - (n - 1) / 2)
        return DTensor.from_local(local, mesh, [placement])
    return DTensor.from_local(full, mesh, [Replicate()]).redistribute(mesh, [placement])


def redistributions() -> dict:
    """On each rank, for each transition: the local tensor before and after, the
    collectives that ran (name, bytes, group size), and the global tensor after."""
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    results = {}
    for name, source, target in TRANSITIONS:
        before = make_dtensor(mesh, source)
        with CollectiveTrace(dist.get_world_size()) as trace:
            after = before.redistribute(mesh, [target])
            local_after = after.to_local().clone()
        results[name] = {"before": before.to_local().clone(), "after": local_after,
                         "calls": [(c.name, c.nbytes, c.group_size) for c in trace.calls],
                         "bytes_per_rank": trace.bytes_per_rank(),
                         "global": after.full_tensor()}
    results["Replicate -> Partial"] = _refused_to_partial(mesh)
    return results


def _refused_to_partial(mesh) -> str:
    """``redistribute`` to a Partial target: torch refuses it (_api.py:714-718)."""
    try:
        make_dtensor(mesh, Replicate()).redistribute(mesh, [Partial()])
    except RuntimeError as err:
        return str(err)
    return "accepted"
