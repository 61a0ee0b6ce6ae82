"""Checkpoints the way PyTorch's DDP tutorial writes them, made safe to resume from.
(https://pytorch.org/tutorials/intermediate/ddp_tutorial.html#save-and-load-checkpoints)

Rank 0 writes (every rank holds the same weights, so one copy is enough), through a
temporary file and ``os.replace`` so a rank killed mid-write never leaves a half checkpoint
that the restarted job would trust; then a barrier, so no rank reads a file still being
written. Every rank loads with ``map_location`` so tensors saved from ``cuda:0`` land on the
rank's own device instead of all piling onto GPU 0.
"""

from __future__ import annotations

import os
from pathlib import Path

import torch
import torch.distributed as dist


def save_on_rank0(path, state: dict) -> None:
    """Rank 0 writes ``state`` atomically; every rank waits until it is on disk."""
    if dist.get_rank() == 0:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_name(f".{path.name}.partial")
        torch.save(state, partial)
        os.replace(partial, path)
    dist.barrier()


def load_if_present(path, device) -> dict | None:
    """The checkpoint's contents on ``device``, or None when there is none yet."""
    if path is None or not Path(path).is_file():
        return None
    return torch.load(path, map_location=device, weights_only=True)
