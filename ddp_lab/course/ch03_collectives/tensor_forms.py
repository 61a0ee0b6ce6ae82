"""Notebook 03b: collectives on one tensor instead of a list, futures, functional collectives.

- ``dist.all_gather(list, t)`` fills one output tensor per rank; ``dist.all_gather_single
  (out, t)`` (2.13's name for ``all_gather_into_tensor``, which now only forwards to it with a
  FutureWarning, torch/distributed/distributed_c10d.py) fills one tensor, concatenated or
  stacked. gloo gathers the list form into one flat buffer too and then copies each piece
  out (upstream ProcessGroupGloo.cpp, ``AsyncAllgatherWork``). The same pair exists for
  reduce-scatter: ``reduce_scatter(out, list)`` and ``reduce_scatter_single(out, t)``.
  FSDP2 calls the single-tensor forms (torch/distributed/fsdp/_fully_shard/_fsdp_collectives.py).
- ``work.get_future()`` turns an async collective into a ``torch.futures.Future`` whose
  callbacks (``then``) run when the data is there: DDP's comm hooks return one
  (torch/distributed/algorithms/ddp_comm_hooks/default_hooks.py, ``_allreduce_fut``).
- Functional collectives (torch/distributed/_functional_collectives.py) return a new tensor
  and leave the input alone: an ``AsyncCollectiveTensor`` that waits (``wait_tensor``) at its
  first use. DTensor issues them, and torch.compile traces them (``dist.*`` calls are remapped
  to them, ``traceable_collective_remaps``).

Rank r starts from ``1, 2, 3, ...`` plus ``10 * r``, as in notebook 03.
"""

from __future__ import annotations

import warnings

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol

from ddp_lab.course.collective_trace import CollectiveTrace


def rank_values(n: int) -> torch.Tensor:
    """This rank's ``1..n`` plus ``10 * rank``, the course's convention."""
    return torch.arange(1.0, n + 1) + 10 * dist.get_rank()


def gather_both_ways(n: int = 3) -> dict:
    """all_gather into a list and all_gather_single into one tensor, with the traced c10d
    op of each; then the stacked output form, which the docstring allows and gloo refuses
    (it checks each piece of the output against the input's shape)."""
    world, mine = dist.get_world_size(), rank_values(n)
    pieces, flat = [torch.empty(n) for _ in range(world)], torch.empty(world * n)
    with CollectiveTrace(world) as trace:
        dist.all_gather(pieces, mine)
        dist.all_gather_single(flat, mine)
    try:
        dist.all_gather_single(torch.empty(world, n), mine)
        stacked = "accepted"
    except RuntimeError as err:
        stacked = str(err).splitlines()[0]
    return {"list": pieces, "flat": flat, "stacked": stacked,
            "ops": [call.name for call in trace.calls]}


def reduce_scatter_both_ways(per_rank: int = 2) -> dict:
    """reduce_scatter of a list (one input tensor per destination rank) and
    reduce_scatter_single of one tensor: each rank ends with the sum of its slice."""
    world = dist.get_world_size()
    mine = rank_values(world * per_rank)
    from_list, from_tensor = torch.empty(per_rank), torch.empty(per_rank)
    with CollectiveTrace(world) as trace:
        dist.reduce_scatter(from_list, list(mine.chunk(world)))
        dist.reduce_scatter_single(from_tensor, mine)
    return {"input": mine, "list": from_list, "tensor": from_tensor,
            "ops": [call.name for call in trace.calls]}


def old_name(n: int = 3) -> dict:
    """all_gather_into_tensor, all_gather_single's older name: the same result, and a
    FutureWarning in torch 2.13."""
    world, mine = dist.get_world_size(), rank_values(n)
    out = torch.empty(world * n)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        dist.all_gather_into_tensor(out, mine)
    return {"out": out, "warnings": [(w.category.__name__, str(w.message)) for w in caught]}


def future_chain() -> dict:
    """An async all_reduce's future, with a callback that averages: what a DDP comm hook
    returns for each bucket."""
    mine = rank_values(3)
    work = dist.all_reduce(mine, async_op=True)
    future = work.get_future()
    averaged = future.then(lambda done: done.value()[0] / dist.get_world_size())
    return {"future": type(future).__name__, "mean": averaged.wait(),
            "value": [t.clone() for t in future.value()]}


def functional_all_reduce() -> dict:
    """funcol.all_reduce: a new tensor, the input left alone, an AsyncCollectiveTensor
    until it is waited for (explicitly, or by its first use). The trace names the
    functional op ``all_reduce`` (namespace ``_c10d_functional``) and dist.all_reduce's
    ``allreduce_`` (namespace ``c10d``)."""
    mine = rank_values(3)
    before = mine.clone()
    with CollectiveTrace(dist.get_world_size()) as trace:
        dist.all_reduce(mine.clone())                     # for comparison: c10d's allreduce_
        result = funcol.all_reduce(mine, "sum", dist.group.WORLD)
        kind = type(result).__name__
        waited = funcol.wait_tensor(result)
        used = funcol.all_reduce(mine, "sum", dist.group.WORLD) * 1   # first use waits
    return {"type": kind, "waited_type": type(waited).__name__, "used_type": type(used).__name__,
            "sum": waited.clone(), "used": used.clone(), "input_unchanged": torch.equal(mine, before),
            "ops": [call.name for call in trace.calls]}


def p2p_future() -> str:
    """What ``get_future()`` does on a gloo isend/irecv handle (a ring: send right, receive
    from the left): the error gloo raises, since its point-to-point work has no future."""
    rank, world = dist.get_rank(), dist.get_world_size()
    buffer = torch.empty(1)
    works = [dist.isend(torch.ones(1), (rank + 1) % world), dist.irecv(buffer, (rank - 1) % world)]
    try:
        works[0].get_future()
        said = "a future"
    except RuntimeError as err:
        said = str(err).splitlines()[0]
    for work in works:
        work.wait()
    return said


def tour() -> dict:
    """Worker: every demo above on this rank."""
    return {"gather": gather_both_ways(), "reduce_scatter": reduce_scatter_both_ways(),
            "old_name": old_name(), "future": future_chain(), "functional": functional_all_reduce(),
            "p2p_future": p2p_future() if dist.get_world_size() > 1 else None}


def coalesced(sizes=(3, 5, 2)) -> dict:
    """Several all_reduce calls inside ``dist._coalescing_manager`` (torch/distributed/
    distributed_c10d.py; a private API that batch_isend_irecv builds on; FSDP2 does not use
    it: it copies into one flat buffer and issues one all_gather_single /
    reduce_scatter_single, torch/distributed/fsdp/_fully_shard/_fsdp_collectives.py) run as one
    ``allreduce_coalesced_`` op: one round of messages for all of them, no copy by hand."""
    tensors = [torch.full((n,), float(dist.get_rank() + 1)) for n in sizes]
    with CollectiveTrace() as trace:
        with dist._coalescing_manager(async_ops=True) as handle:
            for t in tensors:
                dist.all_reduce(t)
        handle.wait()
    return {"sums": [t.tolist() for t in tensors], "ops": [call.name for call in trace.calls]}
