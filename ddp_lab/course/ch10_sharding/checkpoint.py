"""Sharded checkpoints with ``torch.distributed.checkpoint`` (DCP), notebook 10.

Each rank writes only its own shards (one file per rank plus a ``.metadata`` file that says
which piece of which tensor lives where), so nobody gathers the full model. Loading reads
that metadata and lets every rank fetch the pieces its own shards need, so a checkpoint
saved on N ranks loads on M ranks: resharding happens at load time
(https://pytorch.org/docs/stable/distributed.checkpoint.html).
``dcp.async_save`` copies the state to CPU memory (a staging step), returns a future at once,
and writes the files in a background thread while training goes on.
"""

from __future__ import annotations

import os
import time
from dataclasses import replace

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp

from ddp_lab.course.ch10_sharding.equivalence import TrainConfig, fsdp2_torch, train_step

CHECKPOINT_MODEL = TrainConfig(inputs=64, width=256, outputs=64, global_batch=12, steps=2)


def _local_shapes(state: dict) -> dict:
    return {k: tuple(v.to_local().shape) for k, v in state.items() if hasattr(v, "to_local")}


def _full(state: dict) -> dict:
    return {k: v.full_tensor().clone() for k, v in state.items()}


def save_sharded(folder: str, config: TrainConfig = CHECKPOINT_MODEL) -> dict:
    """Train FSDP2 a few steps, then save its sharded model state: with ``dcp.save`` into
    ``folder/sync`` and with ``dcp.async_save`` into ``folder/async`` (timed, both)."""
    setup = fsdp2_torch(config)
    for step in range(config.steps):
        train_step(setup, config, step)
    state = setup.model.state_dict()
    start = time.perf_counter()
    dcp.save(state, checkpoint_id=os.path.join(folder, "sync"))
    saved = time.perf_counter()
    future = dcp.async_save(state, checkpoint_id=os.path.join(folder, "async"))
    returned = time.perf_counter()
    future.result()
    done = time.perf_counter()
    return {"local_shapes": _local_shapes(state), "full": _full(state),
            "save_s": saved - start, "async_returned_s": returned - saved,
            "async_done_s": done - saved,
            "files": sorted(os.listdir(os.path.join(folder, "sync")))}


def load_resharded(folder: str, which: str = "sync", config: TrainConfig = CHECKPOINT_MODEL) -> dict:
    """A fresh FSDP2 model (differently initialized) on however many ranks this run has,
    loaded from ``folder/which``: its local shard shapes and its full tensors."""
    setup = fsdp2_torch(replace(config, seed=config.seed + 1))
    state = setup.model.state_dict()
    start = time.perf_counter()
    dcp.load(state, checkpoint_id=os.path.join(folder, which))
    seconds = time.perf_counter() - start
    setup.model.load_state_dict(state)
    return {"world_size": dist.get_world_size(), "local_shapes": _local_shapes(state),
            "full": _full(setup.model.state_dict()), "load_s": seconds}


def same_tensors(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
