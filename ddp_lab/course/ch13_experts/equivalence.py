"""scratch.MoE with its experts split over the ranks against the same layer on one process
with every expert (notebook 13): the same seed builds the same router and experts, each rank
feeds its own tokens, and the one process feeds every rank's tokens in turn."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist

from ddp_lab import scratch


@dataclass(frozen=True)
class MoEConfig:
    d_model: int = 16
    d_hidden: int = 32
    n_experts: int = 8
    top_k: int = 2
    capacity_factor: float | None = 1.0
    tokens: int = 32   # per rank
    seed: int = 0


def make_moe(config: MoEConfig, group=None) -> scratch.MoE:
    torch.manual_seed(config.seed)
    return scratch.MoE(config.d_model, config.d_hidden, config.n_experts, top_k=config.top_k,
                       capacity_factor=config.capacity_factor, group=group)


def tokens(config: MoEConfig, rank: int) -> torch.Tensor:
    return torch.randn(config.tokens, config.d_model, generator=torch.Generator().manual_seed(100 + rank))


def _loss(moe, out):
    return out.square().mean() + 0.01 * moe.aux_loss


def expert_parallel(config: MoEConfig = MoEConfig()) -> dict:
    """This rank's output, its experts' gradients, the router's gradient summed over the
    ranks, and the routing counts."""
    moe = make_moe(config)
    out = moe(tokens(config, dist.get_rank()))
    _loss(moe, out).backward()
    router = moe.router.weight.grad.clone()
    dist.all_reduce(router)
    return {"out": out.detach(), "router_grad": router, "stats": moe.stats,
            "experts": list(range(moe.first_expert, moe.first_expert + moe.local)),
            "expert_grads": {moe.first_expert + i: [p.grad for p in e.parameters()]
                             for i, e in enumerate(moe.experts)}}


def one_process(config: MoEConfig, world: int, group=None) -> dict:
    """The reference: every expert in one process (``group`` of one rank, or a 1-rank job),
    each rank's tokens in turn."""
    moe = make_moe(config, group)
    outs, stats = [], []
    for rank in range(world):
        out = moe(tokens(config, rank))
        _loss(moe, out).backward()
        outs.append(out.detach())
        stats.append(moe.stats)
    return {"outs": outs, "stats": stats, "router_grad": moe.router.weight.grad,
            "expert_grads": {e: [p.grad for p in m.parameters()] for e, m in enumerate(moe.experts)}}


def both(config: MoEConfig = MoEConfig()) -> dict:
    """The expert-parallel layer on every rank; rank 0 also computes the reference on a
    group of its own (every rank takes part in creating each one-rank group)."""
    result = expert_parallel(config)
    solo = [dist.new_group([r]) for r in range(dist.get_world_size())]
    if dist.get_rank() == 0:
        result["one process"] = one_process(config, dist.get_world_size(), solo[0])
    return result
