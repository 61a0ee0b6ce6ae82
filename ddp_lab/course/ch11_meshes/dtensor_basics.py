"""DTensor basics (notebook 11): making DTensors, reading them back, an op whose result is
``Partial``, uneven shards, and torch's own collective counter.

- ``distribute_tensor(t, mesh, [Shard(0)])`` takes the *global* tensor and keeps the copy of
  the mesh's first rank: it scatters that rank's pieces (``src_data_rank=0``,
  torch/distributed/tensor/_api.py ``distribute_tensor``, ``Shard._make_shard_tensor`` in
  placement_types.py). ``DTensor.from_local`` takes each rank's *local* piece as it is and
  communicates nothing, unless ``run_check=True``: then the ranks all-gather their metadata
  (``check_tensor_meta``, _collective_utils.py) and every ``Replicate`` dimension is broadcast
  from its first rank (``_FromTorchTensor.forward``, _api.py).
- ``to_local()`` is this rank's piece, free; ``full_tensor()`` all-gathers the whole tensor.
- Sharding propagation: each op looks up a strategy for its inputs' placements. A matmul of
  ``Shard(1)`` by ``Shard(0)`` operands multiplies matching slices locally, so each rank holds
  a summand: the result is ``Partial()``, and no byte moved. Its ``redistribute`` to
  ``Replicate()`` is the all-reduce, the one collective of a row-parallel layer.
- A dim that the mesh does not divide is split like ``torch.chunk``: shards of ceil(n/k)
  rows, the last ones shorter or empty (placement_types.py ``_split_tensor``).
- ``CommDebugMode`` (torch/distributed/tensor/debug/_comm_mode.py) counts the collectives
  that go through the dispatcher, as the course's ``collective_trace.CollectiveTrace`` does.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor, Replicate, Shard, distribute_tensor
from torch.distributed.tensor.debug import CommDebugMode

from ddp_lab.course.collective_trace import CollectiveTrace

UNEVEN_ROWS = 5   # not divisible by 2, 3 or 4 ranks


def operands() -> tuple[torch.Tensor, torch.Tensor]:
    """The global A (4 x 8) and B (8 x 4) of the matmul, the same on every rank and in the
    notebook's own process."""
    g = torch.Generator().manual_seed(0)   # small integers: the sums are exact, the cells short
    return (torch.randint(-3, 4, (4, 8), generator=g).float(),
            torch.randint(-3, 4, (8, 4), generator=g).float())


def _counts(mode: CommDebugMode) -> dict[str, int]:
    """CommDebugMode's counts with readable keys (its keys are op packets)."""
    return {str(op).split(".")[-1]: n for op, n in mode.get_comm_counts().items()}


def making_dtensors(mesh) -> dict:
    """distribute_tensor from rank-dependent data (rank 0's wins), and from_local of a
    rank-dependent 'replica' with and without run_check."""
    rank = dist.get_rank()
    mine = torch.arange(8.0).reshape(4, 2) + 100 * rank     # every rank passes its own
    with CommDebugMode() as distribute_mode:
        distributed = distribute_tensor(mine, mesh, [Shard(0)])
    unchecked = DTensor.from_local(torch.full((2,), float(rank)), mesh, [Replicate()])
    with CommDebugMode() as check_mode:
        checked = DTensor.from_local(torch.full((2,), float(rank)), mesh, [Replicate()],
                                     run_check=True)
    with CommDebugMode() as full_mode:
        whole = distributed.full_tensor()
    return {"distribute": {"local": distributed.to_local().clone(), "full": whole,
                           "counts": _counts(distribute_mode),
                           "full_tensor_counts": _counts(full_mode)},
            "unchecked_replica": unchecked.to_local().clone(),
            "checked_replica": checked.to_local().clone(), "check_counts": _counts(check_mode)}


def partial_matmul(mesh) -> dict:
    """A (Shard(1)) @ B (Shard(0)): a Partial result with no communication, then
    redistribute to Replicate: one all-reduce, counted by CommDebugMode and by the
    course's CollectiveTrace."""
    a, b = operands()
    da = distribute_tensor(a, mesh, [Shard(1)])
    db = distribute_tensor(b, mesh, [Shard(0)])
    with CommDebugMode() as matmul_mode:
        product = da @ db
    with CommDebugMode() as mode, CollectiveTrace(dist.get_world_size()) as trace:
        replicated = product.redistribute(mesh, [Replicate()])
    return {"a_local": da.to_local().clone(), "b_local": db.to_local().clone(),
            "placements": [repr(p) for p in product.placements],
            "partial_local": product.to_local().clone(), "matmul_counts": _counts(matmul_mode),
            "after_placements": [repr(p) for p in replicated.placements],
            "replicated": replicated.to_local().clone(),
            "redistribute_counts": _counts(mode), "traced_counts": trace.counts()}


def uneven_shards(mesh) -> dict:
    """A tensor of UNEVEN_ROWS rows sharded on dim 0, and from_local of those uneven pieces
    with and without the global ``shape`` and ``stride`` (``from_local`` takes them only
    together: one alone raises "Please pass both shape and stride at the same time",
    T/distributed/tensor/_api.py:181-195)."""
    full = torch.arange(UNEVEN_ROWS * 3.0).reshape(UNEVEN_ROWS, 3)
    sharded = distribute_tensor(full, mesh, [Shard(0)])
    local = sharded.to_local()
    guessed = DTensor.from_local(local, mesh, [Shard(0)])       # assumes even shards
    told = DTensor.from_local(local, mesh, [Shard(0)], shape=full.shape, stride=full.stride())
    return {"local_rows": local.shape[0], "full": sharded.full_tensor(),
            "guessed_shape": tuple(guessed.shape), "told_shape": tuple(told.shape),
            "told_full": told.full_tensor()}


def dtensor_basics() -> dict:
    """Worker: all of the above on a 1-D mesh over every rank."""
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    return {"making": making_dtensors(mesh), "matmul": partial_matmul(mesh),
            "uneven": uneven_shards(mesh)}
