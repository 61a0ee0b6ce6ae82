"""Who gets the tokens (notebook 13): a few steps of training an expert-parallel MoE on
clustered tokens, with and without Switch's load-balancing loss, recording each step's load
per expert (from every rank), tokens dropped at the capacity, the loss, and how long the
step spent in the all-to-alls; then the share of dropped tokens against the capacity factor.

Tokens come from a few clusters, each with its own target map. A freshly initialised router
sends the tokens of a tight cluster, nearly one vector, to the same experts, so a few experts
get most tokens and, with a capacity, drop many of them. The auxiliary loss
``n_experts * sum_e f_e P_e`` (f: share of assignments to e, P: mean router probability of e)
is exactly 1 when either is uniform; its gradient in P_e is ``n_experts * f_e``.
"""

from __future__ import annotations

import importlib
import time
from contextlib import ExitStack
from dataclasses import dataclass, replace
from unittest import mock

import torch
import torch.distributed as dist

from ddp_lab import scratch

# The module itself (``scratch.moe`` would do too; said once for the timers' sake).
moe_module = importlib.import_module("ddp_lab.scratch.moe")


@dataclass(frozen=True)
class TrainConfig:
    d_model: int = 16
    d_hidden: int = 32
    n_experts: int = 8
    top_k: int = 2
    capacity_factor: float | None = 1.25   # None: dropless, every assignment kept
    tokens: int = 64   # per rank and step
    clusters: int = 3
    steps: int = 25
    lr: float = 0.01
    seed: int = 0


def clustered_batch(config: TrainConfig, rank: int, step: int):
    """Tokens from ``clusters`` clusters (the same centres and maps everywhere), and targets."""
    fixed = torch.Generator().manual_seed(config.seed)
    centres = 3 * torch.randn(config.clusters, config.d_model, generator=fixed)
    maps = torch.randn(config.clusters, config.d_model, config.d_model, generator=fixed) / config.d_model ** 0.5
    g = torch.Generator().manual_seed(1000 * step + rank)
    which = torch.randint(0, config.clusters, (config.tokens,), generator=g)
    x = centres[which] + torch.randn(config.tokens, config.d_model, generator=g)
    return x, torch.einsum("td,tdo->to", x, maps[which])


def _timed(fn, box: list):
    def call(*args):
        start = time.perf_counter()
        try:
            return fn(*args)
        finally:
            box[0] += time.perf_counter() - start
    return call


def comm_timers(box: list) -> ExitStack:
    """Time every all-to-all of scratch.MoE (dispatch, combine, both backwards) into box[0]."""
    stack = ExitStack()
    for name in ("dispatch", "all_to_all"):
        stack.enter_context(mock.patch.object(moe_module, name, _timed(getattr(moe_module, name), box)))
    return stack


def sync_gradients(moe, world: int, dp_group=None) -> None:
    """For one loss averaged over all ``world`` ranks. The router is replicated everywhere:
    its gradient (this rank's tokens) is summed over every rank and divided by ``world``, as
    DDP would average it. An expert's gradient already sums the tokens of every rank of its
    expert-parallel group (the all-to-all's backward brings them); its replicas in the other
    groups, one per rank of ``dp_group`` (experts replicated over data parallelism), saw other
    tokens, so it is summed over ``dp_group`` and then also divided by ``world``, not by the
    size of ``dp_group`` as DDP over that group would (that leaves it ep times too large)."""
    dist.all_reduce(moe.router.weight.grad)
    if dp_group is not None and dist.get_world_size(dp_group) > 1:
        for expert in moe.experts:
            for p in expert.parameters():
                dist.all_reduce(p.grad, group=dp_group)
    for p in moe.parameters():
        p.grad /= world


def train(config: TrainConfig = TrainConfig(), aux_weight: float = 0.0) -> dict:
    world = dist.get_world_size()
    torch.manual_seed(config.seed)
    moe = scratch.MoE(config.d_model, config.d_hidden, config.n_experts, config.top_k,
                      config.capacity_factor)
    optimizer = torch.optim.Adam(moe.parameters(), lr=config.lr)
    history = []
    for step in range(config.steps):
        x, y = clustered_batch(config, dist.get_rank(), step)
        box = [0.0]
        start = time.perf_counter()
        with comm_timers(box):
            out = moe(x)
            loss = torch.nn.functional.mse_loss(out, y)
            (loss + aux_weight * moe.aux_loss).backward()
        sync_gradients(moe, world)
        optimizer.step()
        optimizer.zero_grad()
        history.append({"loss": loss.item(), "aux": moe.aux_loss.item(), "requested": moe.stats.requested,
                        "dropped": moe.stats.dropped, "comm": box[0], "step": time.perf_counter() - start})
    return {"history": history, "capacity": capacity_sweep(moe, config)}


def capacity_sweep(moe, config: TrainConfig, factors=(0.5, 0.75, 1.0, 1.25, 1.5, 2.0, 3.0)) -> dict:
    """Share of this rank's assignments dropped at each capacity factor, router as trained."""
    x, _ = clustered_batch(config, dist.get_rank(), config.steps)
    shares = {}
    for factor in factors:
        moe.capacity_factor = factor
        with torch.no_grad():
            moe(x)
        shares[factor] = moe.stats.dropped / (config.tokens * config.top_k)
    moe.capacity_factor = config.capacity_factor
    return shares


def with_and_without(config: TrainConfig = TrainConfig(), aux_weight: float = 0.1) -> dict:
    """Three runs from the same start: the capacity without and with the aux loss, and the
    control that keeps every assignment (no capacity, no aux loss)."""
    return {"without": train(config, 0.0), "with": train(config, aux_weight),
            "dropless": train(replace(config, capacity_factor=None), 0.0)}
