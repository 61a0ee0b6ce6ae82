"""Notebook 05b: three checkpoint facts around DDP's ``module.`` prefix and torch.load.

- ``ddp_model.state_dict()`` names every key ``module.<name>`` (DDP holds the model as
  ``self.module``): a plain model refuses those keys.
  ``torch.nn.modules.utils.consume_prefix_in_state_dict_if_present`` (named in DDP's
  docstring) strips the prefix in place; saving ``ddp_model.module.state_dict()`` avoids it.
- ``torch.distributed.checkpoint`` (DCP) with ``get_model_state_dict`` /
  ``set_model_state_dict`` (torch/distributed/checkpoint/state_dict.py) gives keys without
  the wrapper's prefix; each rank writes a file of its own (DCP's default planner keeps one
  copy of a replicated tensor, ``dedup_save_plans``), and the same code serves FSDP's sharded
  models (notebook 10).
- ``torch.load`` unpickles only tensors, primitive types and containers of them by default
  since torch 2.6 (``weights_only=True``): a checkpoint holding an arbitrary object (a config
  class, a lambda) is refused, because unpickling runs code. A class you trust is allowlisted
  with ``torch.serialization.add_safe_globals`` or, for one load, the ``safe_globals``
  context manager (torch/serialization.py); ``weights_only=False`` trusts the whole file.
"""

from __future__ import annotations

import os
import pickle
from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import get_model_state_dict, set_model_state_dict
from torch.nn.modules.utils import consume_prefix_in_state_dict_if_present
from torch.nn.parallel import DistributedDataParallel as DDP

from ddp_lab.course.models import ToyModel


@dataclass
class RunSettings:
    """A non-tensor object a checkpoint might carry (what weights_only refuses)."""

    lr: float = 0.1


def prefixes(folder: str) -> dict:
    """The keys DDP's state_dict has, what a plain model makes of them, and DCP's keys; then
    a DCP save on every rank, loaded into a fresh plain model."""
    torch.manual_seed(0)
    ddp = DDP(ToyModel())
    ddp_keys = list(ddp.state_dict())
    refused = _load_error(ToyModel(), ddp.state_dict())
    stripped = ddp.state_dict()
    consume_prefix_in_state_dict_if_present(stripped, "module.")
    plain = ToyModel()
    plain.load_state_dict(stripped)
    dcp_state = get_model_state_dict(ddp)
    dcp.save({"model": dcp_state}, checkpoint_id=folder)
    fresh = ToyModel()
    restored = {"model": get_model_state_dict(fresh)}
    dcp.load(restored, checkpoint_id=folder)
    set_model_state_dict(fresh, restored["model"])
    dist.barrier()
    return {"ddp_keys": ddp_keys, "plain_refuses": refused, "dcp_keys": list(dcp_state),
            "dcp_files": {name: os.path.getsize(os.path.join(folder, name))
                          for name in sorted(os.listdir(folder))},
            "restored_equal": all(torch.equal(a, b) for a, b in
                                  zip(fresh.state_dict().values(), ddp.module.state_dict().values()))}


def _load_error(model, state) -> str:
    try:
        model.load_state_dict(state)
    except RuntimeError as err:
        return str(err).splitlines()[0] + " ..."
    return ""


def weights_only(path: str) -> dict:
    """torch.load on a checkpoint with a dataclass in it: refused by default (the message
    names the allowlist), read with ``weights_only=True`` inside
    ``torch.serialization.safe_globals([RunSettings])`` (and refused again after it), and with
    ``weights_only=False`` (which runs whatever the pickle says: only for files you trust)."""
    torch.save({"weights": torch.ones(2), "settings": RunSettings()}, path)
    refused, advice = _refusal(path)
    with torch.serialization.safe_globals([RunSettings]):
        allowlisted = torch.load(path)  # weights_only=True, the default
    trusted = torch.load(path, weights_only=False)
    torch.save({"weights": torch.ones(2), "settings": {"lr": 0.1}}, path)
    return {"refused": refused, "advice": advice,
            "allowlisted": type(allowlisted["settings"]).__name__,
            "refused_after": bool(_refusal(path.replace(".pt", "_again.pt"), RunSettings())[0]),
            "trusted": type(trusted["settings"]).__name__,
            "plain_ok": torch.load(path)["settings"] == {"lr": 0.1}}


def _refusal(path: str, settings: RunSettings | None = None) -> tuple[str, str]:
    """torch.load's refusal of a file holding a RunSettings: its first line, and the line
    that says which allowlist call would accept the class."""
    if settings is not None:
        torch.save({"settings": settings}, path)
    try:
        torch.load(path)
    except pickle.UnpicklingError as err:
        lines = str(err).splitlines()
        return lines[0], next((line.strip() for line in lines if "add_safe_globals" in line), "")
    return "", ""
