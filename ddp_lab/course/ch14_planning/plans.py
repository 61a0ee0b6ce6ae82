"""The six plans of notebook 14, each built from the course's from-scratch code on 4 ranks,
all training the same MLP (``PlanConfig``) on the same global batch with Adam:

- "DDP": ``scratch.DDP`` (one all-reduce per gradient), full Adam on every rank;
- "ZeRO-1": the same, with ``scratch.ShardedOptimizer`` (each rank keeps the Adam state of
  the parameters it owns, then broadcasts them);
- "FSDP": ``scratch.FSDP`` (ZeRO-3: shards, all-gathers in forward and backward,
  reduce-scatters of the gradients);
- "TP": Megatron's column/row pairs (``scratch.tensor_parallel``) over all 4 ranks, every rank
  on the whole batch;
- "PP": ``scratch.pipeline`` with GPipe, one stage of ``layers / 4`` layers per rank;
- "DP2xTP2": two data-parallel replicas, each a tensor-parallel pair.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
import torch.distributed as dist
import torch.nn as nn

from ddp_lab import scratch
from ddp_lab.course.models import MLPConfig, make_mlp
from ddp_lab.scratch.pipeline import PipelineStage
from ddp_lab.scratch.tensor_parallel import ColumnParallelLinear, RowParallelLinear

PLANS = ("DDP", "ZeRO-1", "FSDP", "TP", "PP", "DP2xTP2")


@dataclass(frozen=True)
class PlanConfig:
    """A stack of ``layers`` Linear(width, width) layers with ReLU between them (an even
    number: tensor parallelism pairs a column- and a row-parallel layer), trained with Adam
    on ``global_batch`` rows per step, cut into ``microbatches`` for the pipeline."""

    width: int = 256
    layers: int = 8
    global_batch: int = 64
    microbatches: int = 4
    lr: float = 1e-3
    seed: int = 0

    def __post_init__(self):
        if self.layers % 8 or self.global_batch % (4 * self.microbatches) or self.width % 4:
            raise ValueError(f"{self}: use layers divisible by 8 (4 stages of TP pairs), a "
                             "width divisible by 4 and a global batch divisible by 4 x "
                             "microbatches")

    @property
    def mlp(self) -> MLPConfig:
        return MLPConfig(inputs=self.width, width=self.width, depth=self.layers,
                         outputs=self.width)


def make_model(config: PlanConfig) -> nn.Sequential:
    """The seeded MLP, the same on every rank: Linear, ReLU, Linear, ..., Linear."""
    return make_mlp(config.mlp, config.seed, names=False)


def global_batch(config: PlanConfig, step: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1000 + step)
    return (torch.randn(config.global_batch, config.width, generator=g),
            torch.randn(config.global_batch, config.width, generator=g))


@dataclass
class Built:
    """A plan ready to train: ``step(k)`` runs training step k; ``model`` and ``optimizer``
    are what this rank holds (for the memory count). A step clears the previous step's
    gradients first (``zero_grad``) and leaves its own in ``.grad``, so that they can be
    measured after it."""

    model: nn.Module
    optimizer: object
    step: Callable[[int], None]


def _linears(model: nn.Sequential) -> list[nn.Linear]:
    return [m for m in model if isinstance(m, nn.Linear)]


def _data_parallel_step(model, optimizer, config, before_step, rank, replicas):
    def step(k: int) -> None:
        optimizer.zero_grad()
        x, y = (t.chunk(replicas)[rank] for t in global_batch(config, k))
        nn.functional.mse_loss(model(x), y).backward()
        before_step()
        optimizer.step()
    return step


def ddp(config: PlanConfig, sharded_optimizer: bool = False) -> Built:
    model = scratch.DDP(make_model(config))
    if sharded_optimizer:
        optimizer = scratch.ShardedOptimizer(model.parameters(), torch.optim.Adam, lr=config.lr)
    else:
        optimizer = torch.optim.Adam(model.parameters(), lr=config.lr)
    step = _data_parallel_step(model, optimizer, config, model.sync_gradients,
                               dist.get_rank(), dist.get_world_size())
    return Built(model, optimizer, step)


def fsdp(config: PlanConfig) -> Built:
    model = scratch.FSDP(make_model(config))
    optimizer = torch.optim.Adam(model.parameters(), lr=config.lr)
    step = _data_parallel_step(model, optimizer, config, model.sync_gradients,
                               dist.get_rank(), dist.get_world_size())
    return Built(model, optimizer, step)


def tensor_parallel_mlp(config: PlanConfig, group=None) -> nn.Sequential:
    """Layers 2k and 2k+1 as a Megatron pair: column-parallel, ReLU, row-parallel."""
    layers = []
    for k, linear in enumerate(_linears(make_model(config))):
        cls = ColumnParallelLinear if k % 2 == 0 else RowParallelLinear
        layers.append(cls(linear, group))
        if k < config.layers - 1:
            layers.append(nn.ReLU())
    return nn.Sequential(*layers)


def _average_over(group, model: nn.Module, size: int) -> Callable[[], None]:
    """Data parallelism by hand inside a 2-D plan: one all-reduce per gradient in ``group``."""
    def average() -> None:
        for p in model.parameters():
            p.grad.div_(size)
            dist.all_reduce(p.grad, group=group)
    return average


def tensor_parallel(config: PlanConfig) -> Built:
    model = tensor_parallel_mlp(config)
    optimizer = torch.optim.Adam(model.parameters(), lr=config.lr)
    return Built(model, optimizer,
                 _data_parallel_step(model, optimizer, config, lambda: None, 0, 1))


def two_d(config: PlanConfig) -> Built:
    """Ranks 2r and 2r+1 form tensor-parallel pair r; ranks {0, 2} and {1, 3} average their
    gradients (the same slice in the two replicas). Every rank creates every group, as
    ``dist.new_group`` requires."""
    rank = dist.get_rank()
    tp_groups = [dist.new_group([0, 1]), dist.new_group([2, 3])]
    dp_groups = [dist.new_group([0, 2]), dist.new_group([1, 3])]
    model = tensor_parallel_mlp(config, tp_groups[rank // 2])
    optimizer = torch.optim.Adam(model.parameters(), lr=config.lr)
    average = _average_over(dp_groups[rank % 2], model, 2)
    return Built(model, optimizer,
                 _data_parallel_step(model, optimizer, config, average, rank // 2, 2))


def pipeline_stage(config: PlanConfig, rows: int) -> PipelineStage:
    """Stage r: layers r*L/4 .. (r+1)*L/4 - 1 of the MLP (with the ReLUs between them), for
    micro-batches of ``rows`` rows."""
    rank, stages = dist.get_rank(), dist.get_world_size()
    modules = list(make_model(config))
    per = 2 * config.layers // stages  # Linear and ReLU modules per stage
    return PipelineStage(nn.Sequential(*modules[rank * per:(rank + 1) * per]),
                         (rows, config.width))


def pipeline(config: PlanConfig) -> Built:
    """GPipe over the 4 stages, ``config.microbatches`` micro-batches per step."""
    stage = pipeline_stage(config, config.global_batch // config.microbatches)
    optimizer = torch.optim.Adam(stage.module.parameters(), lr=config.lr)

    def step(k: int) -> None:
        optimizer.zero_grad()
        x, y = global_batch(config, k)
        stage.run("GPipe", list(x.chunk(config.microbatches)), list(y.chunk(config.microbatches)),
                  nn.functional.mse_loss)
        optimizer.step()
    return Built(stage.module, optimizer, step)


BUILDERS = {"DDP": ddp, "ZeRO-1": lambda c: ddp(c, sharded_optimizer=True), "FSDP": fsdp,
            "TP": tensor_parallel, "PP": pipeline, "DP2xTP2": two_d}


def build(name: str, config: PlanConfig) -> Built:
    if name not in BUILDERS:
        raise ValueError(f"plan {name!r} is not one of {PLANS}")
    if dist.get_world_size() != 4:
        raise ValueError(f"the plans are laid out for 4 ranks, not {dist.get_world_size()}")
    return BUILDERS[name](config)
