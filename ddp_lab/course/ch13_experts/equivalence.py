"""scratch.MoE with its experts split over the ranks against the same layer on one process
with every expert (notebook 13): the same seed builds the same router and experts, each rank
feeds its own tokens, and the one process feeds every rank's tokens in turn."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh

from ddp_lab import scratch
from ddp_lab.course.ch13_experts.routing import sync_gradients


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


def expert_and_data_parallel(config: MoEConfig = MoEConfig(), ep: int = 2) -> dict:
    """Expert parallelism inside data parallelism: a (dp, ep) mesh of the ranks, the experts
    split over each ``ep`` group and replicated over the ``dp`` groups (rank ``i * ep + j``
    holds the same experts as ``j``), the router replicated everywhere. Each rank feeds its
    own tokens and the loss is their mean over all ranks; ``routing.sync_gradients`` averages
    the router over every rank and sums each expert over its dp group, dividing by every rank.
    Also returned: each expert's gradient as DDP over the dp group alone would leave it
    (summed over dp, divided by dp only)."""
    world, rank = dist.get_world_size(), dist.get_rank()
    mesh = init_device_mesh("cpu", (world // ep, ep), mesh_dim_names=("dp", "ep"))
    ep_group, dp_group = mesh.get_group("ep"), mesh.get_group("dp")
    moe = make_moe(config, ep_group)
    out = moe(tokens(config, rank))
    _loss(moe, out).backward()
    sync_gradients(moe, world, dp_group)
    dp = dist.get_world_size(dp_group)
    return {"out": out.detach(), "router_grad": moe.router.weight.grad.clone(),
            "ep_ranks": dist.get_process_group_ranks(ep_group),
            "dp_ranks": dist.get_process_group_ranks(dp_group),
            "experts": list(range(moe.first_expert, moe.first_expert + moe.local)),
            "expert_grads": {moe.first_expert + i: [p.grad.clone() for p in e.parameters()]
                             for i, e in enumerate(moe.experts)},
            "expert_grads_dp_mean": {moe.first_expert + i: [p.grad * world / dp for p in e.parameters()]
                                     for i, e in enumerate(moe.experts)}}


def one_process_mean(config: MoEConfig, world: int, group=None) -> dict:
    """The reference for :func:`expert_and_data_parallel`: every expert in one process, the
    loss the mean of every rank's loss."""
    moe = make_moe(config, group)
    outs = []
    for rank in range(world):
        out = moe(tokens(config, rank))
        (_loss(moe, out) / world).backward()
        outs.append(out.detach())
    return {"outs": outs, "router_grad": moe.router.weight.grad,
            "expert_grads": {e: [p.grad for p in m.parameters()] for e, m in enumerate(moe.experts)}}


def both_ep_dp(config: MoEConfig = MoEConfig(), ep: int = 2) -> dict:
    """:func:`expert_and_data_parallel` on every rank; rank 0 also computes the reference on a
    one-rank group of its own."""
    result = expert_and_data_parallel(config, ep)
    solo = [dist.new_group([r]) for r in range(dist.get_world_size())]
    if dist.get_rank() == 0:
        result["one process"] = one_process_mean(config, dist.get_world_size(), solo[0])
    return result


def wrapped_in_ddp(config: MoEConfig = MoEConfig()) -> dict:
    """What DDP over all the ranks does to ``scratch.MoE`` (notebook 13): the experts differ
    from rank to rank with the same shapes, so ``DistributedDataParallel(moe)`` accepts the
    layer and broadcasts rank 0's parameters over every rank's. Returns whether this rank's
    experts still equal the ones built for it after ``DDP(...)``, and what the first forward
    raised (``scratch.MoE`` refuses to run inside such a DDP)."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    moe = make_moe(config)
    built = [p.detach().clone() for p in moe.experts.parameters()]
    wrapped = DDP(moe)
    kept = all(torch.equal(p, b) for p, b in zip(moe.experts.parameters(), built))
    try:
        wrapped(tokens(config, dist.get_rank()))
        error = None
    except RuntimeError as err:
        error = str(err)
    return {"experts kept": kept, "first expert": moe.first_expert, "error": error}
