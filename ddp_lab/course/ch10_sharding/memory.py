"""Where the model state lives, per rank (notebook 10): bytes of parameters, gradients and
optimizer state that each rank really holds after a training step, for DDP and for the
sharded variants, counted from the tensors themselves (a DTensor counts its local shard).

What ZeRO removes (https://arxiv.org/abs/1910.02054): stage 1 shards the optimizer state,
stage 2 also the gradients, stage 3 also the parameters. With Adam the state is two fp32
moments per parameter, so it is the largest piece: 2x the parameters.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from ddp_lab.course.ch10_sharding.equivalence import (VARIANTS, Setup, TrainConfig, global_batch,
                                                     my_rows, train_step)

# ~0.5 M parameters in 8 layers of the same size: large enough that the bookkeeping (step
# counters) does not matter, and even enough that whole parameters split fairly over 1, 2 or
# 4 owners (ZeRO-1 here gives each parameter to one rank).
MEMORY_MODEL = TrainConfig(inputs=256, width=256, outputs=256, hidden_layers=6,
                           global_batch=8, steps=1)
MEASURED = ("DDP", "ZeRO-1 scratch", "ZeRO-3 scratch", "FSDP2 fully_shard")
COMPONENTS = ("parameters", "gradients", "optimizer state")


def local_bytes(t: torch.Tensor) -> int:
    """Bytes this rank stores for ``t``: its local shard if ``t`` is a DTensor."""
    local = t.to_local() if hasattr(t, "to_local") else t
    return local.numel() * local.element_size()


def optimizer_states(optimizer) -> list[dict]:
    """The per-parameter state dicts of any of the course's optimizers: torch's own, the
    scratch ShardedOptimizer (``.local``), ZeroRedundancyOptimizer (``.optim``)."""
    inner = getattr(optimizer, "local", None) or getattr(optimizer, "optim", None) or optimizer
    return list(inner.state.values()) if hasattr(inner, "state") else []


def state_bytes(setup: Setup) -> dict[str, int]:
    """Bytes of each component this rank holds right now."""
    params = list(setup.model.parameters())
    return {"parameters": sum(local_bytes(p) for p in params),
            "gradients": sum(local_bytes(p.grad) for p in params if p.grad is not None),
            "optimizer state": sum(local_bytes(t) for state in optimizer_states(setup.optimizer)
                                   for t in state.values() if isinstance(t, torch.Tensor))}


def measure(name: str, config: TrainConfig = MEMORY_MODEL) -> dict[str, int]:
    """Bytes per component on this rank for variant ``name`` (a key of VARIANTS), taken
    when parameters, gradients and optimizer state all exist: one full step (which creates
    the optimizer state), then the next forward and backward."""
    setup = VARIANTS[name](config)
    train_step(setup, config, 0)
    x, y = global_batch(config, 1)
    torch.nn.functional.mse_loss(setup.model(my_rows(x)), my_rows(y)).backward()
    setup.before_step()
    return state_bytes(setup)


def expected_bytes(stage: str, parameter_bytes: int, world_size: int) -> dict[str, float]:
    """What the ZeRO paper's accounting predicts per rank, for fp32 Adam (two moments)."""
    n = world_size
    full = {"parameters": parameter_bytes, "gradients": parameter_bytes,
            "optimizer state": 2 * parameter_bytes}
    sharded = {"DDP": (), "ZeRO-1": ("optimizer state",),
               "ZeRO-2": ("optimizer state", "gradients"), "ZeRO-3": COMPONENTS}[stage]
    return {c: v / n if c in sharded else v for c, v in full.items()}


def memory_per_rank(names=MEASURED,
                    config: TrainConfig = MEMORY_MODEL) -> dict:
    """On each rank: {variant: {component: bytes}}, plus the world size."""
    return {"world_size": dist.get_world_size(),
            "bytes": {name: measure(name, config) for name in names}}
