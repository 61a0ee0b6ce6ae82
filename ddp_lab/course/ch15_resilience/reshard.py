"""A checkpoint saved by 4 ranks, loaded by 2 and by 3 (notebook 15).

FSDP2 (``fully_shard``) keeps each parameter as a DTensor sharded by rows (dim 0) over the
ranks. ``dcp.save`` writes each rank's rows to its own file and a ``.metadata`` file that
records which rows of which tensor are where; ``dcp.load`` into a model sharded over a
different number of ranks reads, on each rank, the pieces of those files its own rows need
(torch/distributed/checkpoint/state_dict_loader.py). So a job that lost machines restarts on
fewer, and one that got more restarts on more, from the same files.
"""

from __future__ import annotations

import os

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
import torch.nn.functional as F
from torch.distributed.fsdp import fully_shard

from ddp_lab.course.ch15_resilience.workload import rank_slice, regression_data
from ddp_lab.course.models import MLPConfig, make_mlp

MODEL = MLPConfig(inputs=32, width=130, depth=3, outputs=8)  # 130 rows: uneven on 3 and 4


def sharded_model(seed: int):
    """The MLP with every Linear and then the whole model under ``fully_shard``."""
    model = make_mlp(MODEL, seed=seed, names=False)
    for layer in model:
        if isinstance(layer, torch.nn.Linear):
            fully_shard(layer)
    return fully_shard(model)


def _rows(state: dict) -> dict:
    """This rank's number of rows of each tensor (the local shard's dim 0)."""
    return {k: v.to_local().shape[0] for k, v in state.items()}


def _full(state: dict) -> dict:
    return {k: v.full_tensor().clone() for k, v in state.items()}


def train_and_save(folder: str, steps: int = 3) -> dict:
    """On 4 ranks: a few Adam steps of the sharded model, then ``dcp.save`` into ``folder``.
    This rank's rows per tensor, the full tensors (gathered, for the check) and the files."""
    model = sharded_model(seed=0)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    x, y = regression_data(MODEL, steps * 8 * dist.get_world_size())
    for step in range(steps):
        optimizer.zero_grad()
        F.mse_loss(model(rank_slice(x, step, 8)), rank_slice(y, step, 8)).backward()
        optimizer.step()
    state = model.state_dict()
    dcp.save(state, checkpoint_id=folder)
    return {"world": dist.get_world_size(), "rows": _rows(state), "full": _full(state),
            "files": sorted(os.listdir(folder))}


def load_elsewhere(folder: str) -> dict:
    """On however many ranks this run has: a model initialized differently, loaded from the
    checkpoint; its rows per tensor and its full tensors, before and after the load."""
    model = sharded_model(seed=1)
    state = model.state_dict()
    before = _full(state)
    dcp.load(state, checkpoint_id=folder)
    model.load_state_dict(state)
    return {"world": dist.get_world_size(), "rows": _rows(model.state_dict()),
            "before": before, "full": _full(model.state_dict())}


def same_tensors(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
