"""Notebook 06, section 5: the data side of a rank's throughput. Each rank that builds a
``DataLoader(num_workers=W)`` starts W worker processes of its own, next to its own intra-op
compute threads: N ranks on one machine run N x (threads + W) busy processes and threads.
Past the core count they time-share, the usual reason scaling stops at two ranks on a real
node. A loader worker runs with one compute thread (``torch.set_num_threads(1)`` in
torch/utils/data/_utils/worker.py), ``persistent_workers=True`` keeps the workers between
epochs, ``pin_memory=True`` adds a pinning thread per loader on GPU machines.

The workers are started with the process's default start method (``multiprocessing_context``
None: ``torch.multiprocessing``, torch/utils/data/dataloader.py), ``fork`` on Linux before
Python 3.14: a copy of a rank that already runs its process group's threads (and perhaps
CUDA), with its own copy of the data set object.
"""

from __future__ import annotations

import os

import psutil
import torch
import torch.multiprocessing as mp
from torch.utils.data import DataLoader, Dataset


class _WorkerProbe(Dataset):
    """Each sample says how many compute threads the process that read it had."""

    def __len__(self) -> int:
        return 64

    def __getitem__(self, index: int) -> torch.Tensor:
        return torch.tensor(torch.get_num_threads())


def loader_footprint(num_workers: int = 2) -> dict:
    """This rank's intra-op threads and its loader's worker processes while the loader is
    live (workers start with the first ``iter``), the threads each worker computes with,
    and the start method the loader's workers got."""
    loader = DataLoader(_WorkerProbe(), batch_size=8, num_workers=num_workers,
                        persistent_workers=num_workers > 0)
    batches = iter(loader)
    worker_threads = sorted({int(t) for _ in range(2 * max(num_workers, 1))
                             for t in next(batches)})
    workers = psutil.Process().children()
    footprint = {"intra_op_threads": torch.get_num_threads(), "loader_workers": len(workers),
                 "worker_threads": worker_threads, "start_method": mp.get_start_method()}
    del batches, loader  # persistent workers end with their iterator
    return footprint


def busy_per_machine(footprints: list[dict]) -> int:
    """What competes for the cores when every rank computes and loads at once."""
    return sum(f["intra_op_threads"] + f["loader_workers"] for f in footprints)


def cores() -> int:
    return len(os.sched_getaffinity(0))
