"""Notebook 05b: an ``IterableDataset`` (a stream) under DDP.

A stream has no length and no indices, so ``DistributedSampler`` cannot shard it (it needs
``len(dataset)``), and a DataLoader refuses any sampler for it ("expected unspecified sampler
option", torch/utils/data/dataloader.py). The dataset must shard itself, on two levels:
by rank, and inside a rank by DataLoader worker, since each worker process runs its own copy
of ``__iter__`` (``get_worker_info()`` says which one, torch/utils/data/_utils/worker.py).
Without that, every rank and every worker reads the whole stream.

Sharded streams rarely divide evenly, and a rank that runs one step more than its peers
waits in that step's all-reduce until the process group's timeout (notebook 08). Here the ranks agree before each
step, with one small all-reduce (MIN of "I have a batch"), and all stop at the first rank's
end of data.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, DistributedSampler, IterableDataset, get_worker_info


class NumberStream(IterableDataset):
    """Samples ``0 .. n-1`` read in order, each tagged with the (rank, worker) that read it.
    ``shard=True``: reader ``rank * workers + worker`` of ``world * workers`` keeps every
    ``world * workers``-th sample from its own offset."""

    def __init__(self, n: int, rank: int, world: int, shard: bool = True):
        self.n, self.rank, self.world, self.shard = n, rank, world, shard

    def __iter__(self):
        info = get_worker_info()          # None in the main process (num_workers=0)
        worker, workers = (info.id, info.num_workers) if info else (0, 1)
        readers = self.world * workers if self.shard else 1
        first = self.rank * workers + worker if self.shard else 0
        for sample in range(first, self.n, readers):
            yield torch.tensor([sample, self.rank, worker])


def no_sampler_for_streams(n: int = 8) -> dict:
    """What DistributedSampler and DataLoader say when given a stream."""
    stream = NumberStream(n, dist.get_rank(), dist.get_world_size())
    refused = {}
    try:
        DistributedSampler(stream)
    except TypeError as err:
        refused["DistributedSampler(stream)"] = f"TypeError: {err}"
    try:
        DataLoader(stream, sampler=DistributedSampler(range(n)))
    except ValueError as err:
        refused["DataLoader(stream, sampler=...)"] = f"ValueError: {str(err).split(', but')[0]}"
    return refused


def _all_ranks_have(batch) -> bool:
    """One all-reduce (MIN) of this rank's 'I have a batch': True only if every rank has one."""
    flag = torch.tensor([0 if batch is None else 1])
    dist.all_reduce(flag, op=dist.ReduceOp.MIN)
    return bool(flag.item())


def read_stream(n: int = 11, batch_size: int = 2, workers: int = 2, shard: bool = True,
                equal_steps: bool = False) -> dict:
    """Worker: one pass over the stream through a DataLoader with ``workers`` processes.
    Returns this rank's batches as [(sample, worker), ...] and, with ``equal_steps``, how
    many samples it left unread when the first rank ran out."""
    rank, world = dist.get_rank(), dist.get_world_size()
    loader = DataLoader(NumberStream(n, rank, world, shard), batch_size=batch_size,
                        num_workers=workers)
    batches, left_unread, iterator = [], 0, iter(loader)
    while True:
        batch = next(iterator, None)
        if equal_steps and not _all_ranks_have(batch):
            left_unread = 0 if batch is None else len(batch) + sum(len(b) for b in iterator)
            break
        if batch is None:
            break
        batches.append([(sample, worker) for sample, _, worker in batch.tolist()])
    return {"batches": batches, "left_unread": left_unread}


def stream_tour(n: int = 11, batch_size: int = 2, workers: int = 2) -> dict:
    """Worker: the refusals, then the stream read without sharding, sharded, and sharded
    with equal step counts."""
    return {"refused": no_sampler_for_streams(),
            "unsharded": read_stream(n, batch_size, workers, shard=False),
            "sharded": read_stream(n, batch_size, workers),
            "equal_steps": read_stream(n, batch_size, workers, equal_steps=True)}
