"""Notebook 08, part 1: ranks with different amounts of data, a classic DDP hang.

DDP all-reduces the gradients inside every ``backward()``, so every rank must run the same
number of steps. Split 25 samples over 3 ranks by hand and rank 0 gets one batch more than
its peers: its last ``backward()`` waits for partners that never come. The fixes: shards of
equal length (``DistributedSampler``), or ``torch.distributed.algorithms.Join``, which lets
the ranks that ran out shadow the others' all-reduces until everyone is done.
"""

from __future__ import annotations

import math
import time
from contextlib import nullcontext

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.algorithms.join import Join
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

from ddp_lab.course.params import flat_params
from ddp_lab.course.models import ToyModel

DATASET_SIZE = 25
BATCH_SIZE = 2
SHARDINGS = ("strided", "padded", "drop_last")  # by hand; DistributedSampler; ... drop_last


def toy_dataset(size: int = DATASET_SIZE) -> TensorDataset:
    """The same random regression data on every rank (a fixed generator)."""
    g = torch.Generator().manual_seed(0)
    return TensorDataset(torch.randn(size, 10, generator=g), torch.randn(size, 5, generator=g))


def shard_indices(how: str, rank: int, world_size: int, size: int = DATASET_SIZE) -> list[int]:
    """Which samples a rank trains on.

    "strided": ``range(rank, size, world_size)``, the obvious split by hand, uneven when
    ``size % world_size != 0``. "padded": ``DistributedSampler`` (repeats a few samples so
    every shard has ``ceil(size / world_size)``). "drop_last": ``DistributedSampler(...,
    drop_last=True)`` (drops the tail so every shard has ``floor(size / world_size)``).
    """
    if how == "strided":
        return list(range(rank, size, world_size))
    if how not in SHARDINGS:
        raise ValueError(f"how must be one of {SHARDINGS}, not {how!r}")
    sampler = DistributedSampler(range(size), num_replicas=world_size, rank=rank,
                                 shuffle=False, drop_last=how == "drop_last")
    return list(sampler)


def batches_per_rank(how: str, world_size: int) -> list[int]:
    """Steps each rank will take: what decides whether DDP can hang (no process needed)."""
    return [len(DataLoader(shard_indices(how, r, world_size), batch_size=BATCH_SIZE))
            for r in range(world_size)]


def _my_loader(how: str) -> DataLoader:
    indices = shard_indices(how, dist.get_rank(), dist.get_world_size())
    return DataLoader(toy_dataset(), batch_size=BATCH_SIZE, sampler=indices)


def uneven_training(then: str = "barrier") -> int:
    """The classic uneven-inputs hang on gloo: rank 0 has one batch more than ranks 1 and 2.

    ``then`` is what a rank does after its loop: "exit" (return, as the usual report does) or
    "barrier" (wait for the others before, say, saving a checkpoint).
    """
    rank, world_size = dist.get_rank(), dist.get_world_size()
    print(f"world_size: {world_size}")
    torch.manual_seed(0)
    ddp_model = DDP(ToyModel())
    loader = _my_loader("strided")
    for x, target in loader:
        y = F.mse_loss(ddp_model(x), target)
        y.backward()  # all-reduces the gradients: needs every rank
    print(f"rank {rank} done")
    if then == "barrier":
        dist.barrier()
    return len(loader)


def train(how: str = "strided", use_join: bool = False, load_s: float = 0.0) -> dict:
    """A full training loop on this rank's shard; optionally under ``Join``.

    ``load_s`` makes each batch take that long to "load", so the timeline shows who waits.
    Returns the number of batches, the final weights and the (label, start, end) spans.
    """
    torch.manual_seed(0)
    ddp_model = DDP(ToyModel())
    optimizer = torch.optim.SGD(ddp_model.parameters(), lr=0.1)
    loader, spans = _my_loader(how), []
    with Join([ddp_model]) if use_join else nullcontext():
        for x, target in loader:
            began = time.time()
            time.sleep(load_s)
            optimizer.zero_grad()
            F.mse_loss(ddp_model(x), target).backward()
            optimizer.step()
            spans.append(("own batch", began, time.time()))
        ran_out = time.time()
    # leaving Join's block waits until every rank ran out: until then this rank shadows
    # the all-reduces of the ranks still training (with zero gradients)
    spans.append(("joined: shadowing the others' all-reduces", ran_out, time.time()))
    return {"batches": len(loader), "weights": flat_params(ddp_model), "spans": spans}


def replay(how: str = "strided", world_size: int = 3) -> torch.Tensor:
    """What ``train(how, use_join=True)`` computes, replayed in one process.

    Each step sums the gradients of the ranks that still have a batch and divides by the
    *initial* world size (a joined rank contributes zeros: Join's default
    ``divide_by_initial_world_size=True``); at the end DDP's join hook broadcasts the final
    weights from the last rank that joined. With equal shards this is plain DDP.
    """
    torch.manual_seed(0)
    model = ToyModel()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    data = toy_dataset()
    shards = [shard_indices(how, r, world_size) for r in range(world_size)]
    for step in range(math.ceil(max(map(len, shards)) / BATCH_SIZE)):
        optimizer.zero_grad()
        for shard in shards:
            batch = shard[step * BATCH_SIZE:(step + 1) * BATCH_SIZE]
            if batch:
                x, target = data[batch]
                (F.mse_loss(model(x), target) / world_size).backward()
        optimizer.step()
    return flat_params(model)
