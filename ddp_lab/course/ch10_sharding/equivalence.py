"""Same training, six ways (notebook 10): one process on the global batch (the reference),
DDP, ZeRO-1 from scratch (``scratch.ShardedOptimizer``), ZeRO-3 from scratch
(``scratch.FSDP``), torch's ``ZeroRedundancyOptimizer`` and torch's FSDP2 ``fully_shard``.

Every rank trains on its rows of the same global batch with Adam. Sharding changes where
the state lives and which collectives run, not the math, so every variant must end with the
reference's losses and parameters (up to float rounding in the order of the sums).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel

from ddp_lab import scratch
from ddp_lab.course.models import MLPConfig, make_mlp
from ddp_lab.course.one_process import one_process_training


@dataclass(frozen=True)
class TrainConfig:
    """A small MLP whose parameters (13 x 31, 31, 31 x 31, 31, 7 x 31, 7 values) split
    evenly over none of 2, 3 or 4 ranks: every shard needs padding."""

    inputs: int = 13
    width: int = 31
    outputs: int = 7
    hidden_layers: int = 1   # width x width layers between the first and the last
    global_batch: int = 24   # divides by 1, 2, 3 and 4 ranks
    steps: int = 4
    lr: float = 0.02
    seed: int = 0

    @property
    def mlp(self) -> MLPConfig:
        return MLPConfig(inputs=self.inputs, width=self.width, depth=self.hidden_layers + 2,
                         outputs=self.outputs)


def make_model(config: TrainConfig) -> nn.Sequential:
    """The course's seeded MLP, layers named by index (0, 1, 2, ...: the names FSDP's state
    dicts and the sharding figures use)."""
    return make_mlp(config.mlp, config.seed, names=False)


def global_batch(config: TrainConfig, step: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1000 + step)
    return (torch.randn(config.global_batch, config.inputs, generator=g),
            torch.randn(config.global_batch, config.outputs, generator=g))


def my_rows(t: torch.Tensor) -> torch.Tensor:
    """This rank's equal share of the global batch."""
    return t.chunk(dist.get_world_size())[dist.get_rank()] if dist.is_initialized() else t


def reference(config: TrainConfig = TrainConfig()) -> dict:
    """One process, the whole batch, plain Adam: what every variant must reproduce."""
    model = make_model(config)
    optimizer = torch.optim.Adam(model.parameters(), lr=config.lr)
    batches = (global_batch(config, step) for step in range(config.steps))
    return one_process_training(model, optimizer, batches)


def _global_loss(loss: torch.Tensor) -> float:
    """The mean over the global batch: the average of the ranks' means (equal shards)."""
    total = loss.detach().clone()
    dist.all_reduce(total)
    return total.item() / dist.get_world_size()


@dataclass(frozen=True)
class Setup:
    """A variant ready to train: its model, optimizer, what runs between backward and step
    (the scratch FSDP's ``sync_gradients``), and how to read its full parameters back."""

    model: nn.Module
    optimizer: object
    before_step: Callable[[], None]
    full_params: Callable[[], dict]


def train_step(setup: Setup, config: TrainConfig, step: int) -> torch.Tensor:
    """One step on this rank's rows of global batch ``step``; returns the local loss."""
    x, y = global_batch(config, step)
    loss = nn.functional.mse_loss(setup.model(my_rows(x)), my_rows(y))
    loss.backward()
    setup.before_step()
    setup.optimizer.step()
    setup.optimizer.zero_grad()
    return loss


def _plain(state: dict) -> dict:
    """A state dict with every DTensor gathered into an ordinary full tensor."""
    return {k: (v.full_tensor() if hasattr(v, "full_tensor") else v).detach().clone()
            for k, v in state.items()}


def _nothing() -> None:
    pass


def ddp(config: TrainConfig) -> Setup:
    model = DistributedDataParallel(make_model(config))
    optimizer = torch.optim.Adam(model.parameters(), lr=config.lr)
    return Setup(model, optimizer, _nothing, lambda: _plain(model.module.state_dict()))


def zero1_scratch(config: TrainConfig) -> Setup:
    model = DistributedDataParallel(make_model(config))
    optimizer = scratch.ShardedOptimizer(model.parameters(), torch.optim.Adam, lr=config.lr)
    return Setup(model, optimizer, _nothing, lambda: _plain(model.module.state_dict()))


def fsdp_scratch(config: TrainConfig, compute_dtype=None) -> Setup:
    model = scratch.FSDP(make_model(config), compute_dtype=compute_dtype)
    optimizer = torch.optim.Adam(model.parameters(), lr=config.lr)
    return Setup(model, optimizer, model.sync_gradients, lambda: scratch.full_state_dict(model))


def zero_torch(config: TrainConfig) -> Setup:
    from torch.distributed.optim import ZeroRedundancyOptimizer
    model = DistributedDataParallel(make_model(config))
    optimizer = ZeroRedundancyOptimizer(model.parameters(), optimizer_class=torch.optim.Adam,
                                        lr=config.lr)
    return Setup(model, optimizer, _nothing, lambda: _plain(model.module.state_dict()))


def shard_layers(model: nn.Sequential, mesh=None, **fully_shard_options) -> nn.Sequential:
    """``fully_shard`` on every Linear, then on the whole model: bottom-up, as its docstring
    asks, so that each layer is one all-gather and one reduce-scatter. ``mesh`` None: a 1-D
    CPU mesh over all ranks; the options (``mp_policy``, ``offload_policy``, ...) go to every
    call."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    mesh = mesh if mesh is not None else init_device_mesh("cpu", (dist.get_world_size(),))
    for layer in model:
        if isinstance(layer, nn.Linear):
            fully_shard(layer, mesh=mesh, **fully_shard_options)
    fully_shard(model, mesh=mesh, **fully_shard_options)
    return model


def fsdp2_torch(config: TrainConfig, reshard_after_forward: bool = True, mesh=None,
                **fully_shard_options) -> Setup:
    """FSDP2 layer by layer (``shard_layers``) with Adam."""
    model = shard_layers(make_model(config), mesh, reshard_after_forward=reshard_after_forward,
                         **fully_shard_options)
    optimizer = torch.optim.Adam(model.parameters(), lr=config.lr)
    return Setup(model, optimizer, _nothing, lambda: _plain(model.state_dict()))


VARIANTS = {"DDP": ddp, "ZeRO-1 scratch": zero1_scratch, "ZeRO-3 scratch": fsdp_scratch,
            "ZeroRedundancyOptimizer": zero_torch, "FSDP2 fully_shard": fsdp2_torch}


def train(setup: Setup, config: TrainConfig) -> dict:
    """``config.steps`` steps; the global loss of each step and the final full parameters."""
    losses = [_global_loss(train_step(setup, config, step)) for step in range(config.steps)]
    return {"losses": losses, "params": setup.full_params()}


def every_variant(config: TrainConfig = TrainConfig(), names=tuple(VARIANTS)) -> dict:
    """On each rank: {variant: {"losses", "params"}} for the chosen variants, one after the
    other in the same processes."""
    return {name: train(VARIANTS[name](config), config) for name in names}


def largest_difference(result: dict, expected: dict) -> float:
    """The largest absolute difference in losses or parameters between two trainings."""
    diffs = [max(abs(a - b) for a, b in zip(result["losses"], expected["losses"]))]
    diffs += [(result["params"][k] - v).abs().max().item() for k, v in expected["params"].items()]
    return max(diffs)
