"""A sharded model's life outside the training step (notebook 10, section 8): built on the
meta device so that no rank ever holds the whole model, checkpointed with its optimizer
state and resumed, and how FSDP1 (``FullyShardedDataParallel``) stores what FSDP2 stores.

Sources (torch 2.13): ``torch/distributed/fsdp/_fully_shard/_fsdp_param_group.py`` (the
meta-device check before training), ``torch/distributed/tensor/_random.py`` (DTensor random
init), ``torch/distributed/checkpoint/state_dict.py`` (``get_state_dict``,
``set_state_dict``, ``StateDictOptions``), ``torch/distributed/fsdp/_flat_param.py``.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import warnings
from dataclasses import replace

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
import torch.nn as nn

from ddp_lab.course.ch10_sharding.equivalence import (Setup, TrainConfig, _nothing, _plain,
                                                     fsdp2_torch, global_batch, make_model,
                                                     shard_layers, train, train_step)
from ddp_lab.course.one_process import one_process_training
from ddp_lab.launch.config import RUN_DIR_VAR


def _reset_parameters(model: nn.Module, seed: int) -> None:
    """Each layer's own init (``reset_parameters``) on its shards. On a CPU mesh DTensor has
    no coordinated random generator (``is_rng_supported_mesh`` is False, with a warning), so
    each rank draws its shard's numbers from its own generator: seeded per rank (right on a
    1-D mesh, where every rank holds a different shard), or every shard would be a copy of
    rank 0's (``same_seed_shards_repeat`` shows it)."""
    torch.manual_seed(seed + dist.get_rank())
    _quiet_reset(model)


def _quiet_reset(model: nn.Module) -> None:
    """``reset_parameters`` on every module that has one, without DTensor's CPU warning
    (torch/distributed/tensor/_random.py, ``is_rng_supported_mesh``): the notebook says it."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", "DTensor random operators")
        for module in model.modules():
            if hasattr(module, "reset_parameters"):
                module.reset_parameters()


def meta_model(config: TrainConfig) -> nn.Sequential:
    """The model's structure without its storage: shapes and dtypes, no bytes."""
    with torch.device("meta"):
        return make_model(config)


def meta_init(config: TrainConfig) -> dict:
    """Build on meta, ``fully_shard``, ``to_empty(device="cpu")`` (each rank allocates its
    shards only), ``reset_parameters``, then train. The initial full parameters are gathered
    after the fact, for the comparison with one process only."""
    model = meta_model(config)
    on_meta = all(p.is_meta for p in model.parameters())
    shard_layers(model)
    model.to_empty(device="cpu")
    _reset_parameters(model, config.seed)
    local = {name: p.to_local().numel() for name, p in model.named_parameters()}
    full = {name: p.numel() for name, p in model.named_parameters()}
    initial = _plain(model.state_dict())
    optimizer = torch.optim.Adam(model.parameters(), lr=config.lr)
    trained = train(Setup(model, optimizer, _nothing, lambda: _plain(model.state_dict())), config)
    return {"on_meta": on_meta, "local_numel": local, "full_numel": full, "initial": initial,
            **trained, "same seed: shards repeat": same_seed_shards_repeat()}


def same_seed_shards_repeat() -> bool:
    """The pitfall ``_reset_parameters`` avoids: one seed on every rank, and every rank's
    shard of a meta-built weight gets the same numbers."""
    with torch.device("meta"):
        layer = nn.Linear(4, 2 * dist.get_world_size())
    shard_layers(nn.Sequential(layer))
    layer.to_empty(device="cpu")
    torch.manual_seed(0)
    _quiet_reset(layer)
    shards = layer.weight.full_tensor().chunk(dist.get_world_size())
    return all(torch.equal(shard, shards[0]) for shard in shards)


def no_sync_at_construction() -> dict:
    """What ``fully_shard`` does with the weights and buffers it is given: nothing across
    ranks. Each rank builds a ``Linear`` from its own seed (a learner who forgot to seed),
    with a buffer holding its rank, and shards it with ``param_dtype=bf16``. ``fully_shard``
    broadcasts nothing (``_move_states_to_device``, ``_fsdp_init.py:369-401``, only moves
    tensors to the mesh's device) and ``MixedPrecisionPolicy`` has no buffer dtype
    (``_fsdp_api.py:51-54``): each rank keeps its own rows of its own copy, so the full
    weight is stitched from every rank's init, and the buffer stays per rank, in fp32."""
    from torch.distributed.fsdp import MixedPrecisionPolicy
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(1000 + rank)                     # a different init on each rank
    layer = nn.Linear(3, 2 * world)
    layer.register_buffer("scale", torch.full((2,), float(rank)))
    own = layer.weight.detach().clone()
    shard_layers(nn.Sequential(layer), mp_policy=MixedPrecisionPolicy(param_dtype=torch.bfloat16))
    full = layer.weight.full_tensor()
    layer(torch.ones(1, 3))
    return {"full rows from own init": [
                torch.equal(full[row], own[row]) for row in range(full.shape[0])],
            "buffer": layer.scale.tolist(), "buffer dtype": layer.scale.dtype}


def reference_from(initial: dict, config: TrainConfig) -> dict:
    """One process on the whole batches, starting from the parameters ``initial``."""
    model = make_model(config)
    model.load_state_dict(initial)
    optimizer = torch.optim.Adam(model.parameters(), lr=config.lr)
    return one_process_training(model, optimizer,
                                (global_batch(config, step) for step in range(config.steps)))


def _shared_temp_folder() -> str:
    """A fresh folder made by rank 0, its name sent to every rank (one machine here; on
    several machines it would have to be a shared file system). It is made inside the run's
    private folder when ddp_lab launched the ranks, which the launcher removes with the run
    even if a rank crashes; otherwise in the system's temporary folder."""
    parent = os.environ.get(RUN_DIR_VAR)
    name = [tempfile.mkdtemp(prefix="dcp_", dir=parent) if dist.get_rank() == 0 else None]
    dist.broadcast_object_list(name, src=0)
    return name[0]


def _checkpoint_state(setup) -> dict:
    from torch.distributed.checkpoint.state_dict import get_state_dict
    model_state, optimizer_state = get_state_dict(setup.model, setup.optimizer)
    return {"model": model_state, "optim": optimizer_state}


def _restore(setup, folder: str, with_optimizer: bool = True) -> None:
    """Load ``folder`` into ``setup``: DCP fills the sharded state dict in place, each rank
    reading its own pieces; ``set_state_dict`` puts it into the model and the optimizer.
    Without the optimizer, only the model's entries are read (a subset is allowed)."""
    from torch.distributed.checkpoint.state_dict import (StateDictOptions, get_model_state_dict,
                                                         set_model_state_dict, set_state_dict)
    options = StateDictOptions(strict=True)
    if not with_optimizer:
        state = {"model": get_model_state_dict(setup.model)}
        dcp.load(state, checkpoint_id=folder)
        set_model_state_dict(setup.model, state["model"], options=options)
        return
    state = _checkpoint_state(setup)
    dcp.load(state, checkpoint_id=folder)
    set_state_dict(setup.model, setup.optimizer, model_state_dict=state["model"],
                   optim_state_dict=state["optim"], options=options)


def _exported(setup) -> dict:
    """``full_state_dict=True, cpu_offload=True``: plain full tensors on rank 0 (to save
    with ``torch.save`` for one process) and nothing on the other ranks."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
    options = StateDictOptions(full_state_dict=True, cpu_offload=True)
    return {name: type(t).__name__
            for name, t in get_model_state_dict(setup.model, options=options).items()}


def resume_from_checkpoint(config: TrainConfig, saved_after: int = 2) -> dict:
    """Train ``saved_after`` steps, save model and Adam state with DCP into a temporary
    folder, take one more step (uninterrupted); fresh models (another seed) load the
    checkpoint and take the same step, with the optimizer state and without it. Rank 0
    removes the folder once every rank is done with it."""
    folder = _shared_temp_folder()
    found = _save_and_resume(folder, config, saved_after)
    dist.barrier()  # nobody reads the folder any more
    if dist.get_rank() == 0:
        shutil.rmtree(folder)
    dist.barrier()  # removed before anyone looks
    return {**found, "left behind": os.path.exists(folder)}


def _save_and_resume(folder: str, config: TrainConfig, saved_after: int) -> dict:
    setup = fsdp2_torch(config)
    for step in range(saved_after):
        train_step(setup, config, step)
    state = _checkpoint_state(setup)
    dcp.save(state, checkpoint_id=folder)
    moments = state["optim"]["state"]["0.weight"]
    train_step(setup, config, saved_after)
    resumed = {}
    for name, with_optimizer in (("model and optimizer", True), ("model only", False)):
        fresh = fsdp2_torch(replace(config, seed=config.seed + 1))
        _restore(fresh, folder, with_optimizer)
        train_step(fresh, config, saved_after)
        resumed[name] = fresh.full_params()
    return {"uninterrupted": setup.full_params(), "resumed": resumed,
            "optimizer keys": sorted(moments), "exp_avg": type(moments["exp_avg"]).__name__,
            "files": sorted(os.listdir(folder)), "folder": folder,
            "exported": _exported(setup)}


def fsdp1_and_fsdp2(config: TrainConfig) -> dict:
    """What each rank's model holds as parameters: FSDP1 flattens a wrapped module's
    parameters into one padded 1-D ``FlatParameter`` and keeps this rank's slice of it;
    FSDP2 keeps every parameter as its own DTensor, sharded on dim 0. What FSDP1 does *not*
    hide: its default ``state_dict()`` (``FULL_STATE_DICT``) gathers full tensors under the
    original names, and with ``use_orig_params=True`` ``named_parameters()`` (what an
    optimizer is given) lists the original parameters, as views of this rank's slice."""
    from torch.distributed.fsdp import FullyShardedDataParallel
    fsdp1 = FullyShardedDataParallel(make_model(config), device_id=torch.device("cpu"))
    original = FullyShardedDataParallel(make_model(config), device_id=torch.device("cpu"),
                                        use_orig_params=True)
    fsdp2 = fsdp2_torch(config).model
    return {"FSDP1": [(name, type(p).__name__, tuple(p.shape)) for name, p in fsdp1.named_parameters()],
            "FSDP1 state_dict()": [(key, tuple(t.shape)) for key, t in fsdp1.state_dict().items()],
            "FSDP1 use_orig_params=True": [(name, type(p).__name__, tuple(p.shape))
                                           for name, p in original.named_parameters()],
            "FSDP2": [(name, type(p).__name__, tuple(p.to_local().shape))
                      for name, p in fsdp2.named_parameters()]}
