"""A checkpoint saved by 4 ranks, loaded by 2 and by 3 (notebook 15).

FSDP2 (``fully_shard``) keeps each parameter as a DTensor sharded by rows (dim 0) over the
ranks. ``dcp.save`` writes each rank's rows to its own file and a ``.metadata`` file that
records which rows of which tensor are where; ``dcp.load`` into a model sharded over a
different number of ranks reads, on each rank, every saved shard that overlaps its own rows,
whole, and keeps its rows of it (``FileSystemReader.read_data``,
torch/distributed/checkpoint/filesystem.py:861-905: ``_slice_file`` with the stored length,
``torch.load``, then ``narrow_tensor_by_index``). So a job that lost machines restarts on
fewer, and one that got more restarts on more, from the same files.

A restart needs the optimizer's state too (Adam's ``exp_avg`` and ``exp_avg_sq``, sharded
like the parameters): ``get_state_dict(model, optimizer)`` gives both, keyed by parameter
name, and ``set_state_dict`` puts them back (torch/distributed/checkpoint/state_dict.py,
as notebook 10 does).
"""

from __future__ import annotations

import os

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
import torch.nn.functional as F
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
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


def _moments(optimizer_state: dict) -> dict:
    """Adam's moments of every parameter, gathered: {"<name> exp_avg": tensor, ...}."""
    return {f"{name} {moment}": value.full_tensor().clone()
            for name, per_param in optimizer_state["state"].items()
            for moment, value in per_param.items() if moment in ("exp_avg", "exp_avg_sq")}


def _adam_steps(optimizer_state: dict) -> set:
    """Adam's step count of each parameter, as a set (one number when they agree)."""
    return {float(per_param["step"]) for per_param in optimizer_state["state"].values()}


def _checkpoint_state(model, optimizer) -> dict:
    model_state, optimizer_state = get_state_dict(model, optimizer)
    return {"model": model_state, "optim": optimizer_state}


def train_and_save(folder: str, steps: int = 3) -> dict:
    """On 4 ranks: a few Adam steps of the sharded model, then ``dcp.save`` of the model and
    the optimizer into ``folder``. This rank's rows per tensor, the full tensors and Adam's
    moments (gathered, for the check) and the files."""
    model = sharded_model(seed=0)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    x, y = regression_data(MODEL, steps * 8 * dist.get_world_size())
    for step in range(steps):
        optimizer.zero_grad()
        F.mse_loss(model(rank_slice(x, step, 8)), rank_slice(y, step, 8)).backward()
        optimizer.step()
    state = _checkpoint_state(model, optimizer)
    dcp.save(state, checkpoint_id=folder)
    return {"world": dist.get_world_size(), "rows": _rows(state["model"]),
            "full": _full(state["model"]), "moments": _moments(state["optim"]),
            "files": sorted(os.listdir(folder))}


def load_elsewhere(folder: str) -> dict:
    """On however many ranks this run has: a model initialized differently and a fresh Adam,
    loaded from the checkpoint; its rows per tensor and its full tensors before and after
    the load, and Adam's moments and step counts after it."""
    model = sharded_model(seed=1)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    state = _checkpoint_state(model, optimizer)   # fresh Adam: get_state_dict sets its state up
    before = _full(state["model"])
    dcp.load(state, checkpoint_id=folder)
    set_state_dict(model, optimizer, model_state_dict=state["model"],
                   optim_state_dict=state["optim"])
    after = _checkpoint_state(model, optimizer)
    return {"world": dist.get_world_size(), "rows": _rows(after["model"]),
            "before": before, "full": _full(after["model"]),
            "moments": _moments(after["optim"]), "adam_steps": _adam_steps(after["optim"])}


def same_tensors(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
