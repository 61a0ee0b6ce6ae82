"""Notebook 08 on a network: one rank on a slower link sets every rank's pace.

A straggler need not compute slowly: a rank whose network link is slower (an older NIC, a
congested switch port, a machine in another rack) makes DDP's gradient all-reduce slower
for everyone, because a ring all-reduce moves every chunk through every rank's link, so
the ring goes at the pace of its slowest link. ``ddp_lab.Network(rank_bandwidth=...)``
gives one rank such a link (each rank has a link of its own, network.py).
"""

from __future__ import annotations

import time

import torch
import torch.distributed as dist
import torch.nn as nn

WIDTH, LAYERS, BATCH = 512, 2, 32  # 2.1 MB of gradients: the all-reduce dominates a step


def step_times(steps: int = 6) -> list[float]:
    """This rank's seconds per data-parallel training step: forward, backward, the
    gradients averaged with one all-reduce (what DDP does, minus the overlap), an SGD
    update. (DDP and torch.optim import torch._dynamo on first use, seconds per rank in a
    fresh fork server; this lesson needs neither.) The first step is left out."""
    torch.manual_seed(0)
    model = nn.Sequential(*[nn.Linear(WIDTH, WIDTH) for _ in range(LAYERS)])
    x = torch.randn(BATCH, WIDTH)
    times = []
    for _ in range(steps + 1):
        dist.barrier()
        start = time.perf_counter()
        model.zero_grad()
        model(x).square().mean().backward()
        _average_gradients(model)
        _sgd_step(model, lr=0.01)
        times.append(time.perf_counter() - start)
    return times[1:]


@torch.no_grad()
def _sgd_step(model: nn.Module, lr: float) -> None:
    for p in model.parameters():
        p -= lr * p.grad


def _average_gradients(model: nn.Module) -> None:
    grads = [p.grad for p in model.parameters()]
    flat = torch.cat([g.reshape(-1) for g in grads])
    dist.all_reduce(flat)
    flat /= dist.get_world_size()
    offset = 0
    for g in grads:
        g.copy_(flat[offset:offset + g.numel()].view_as(g))
        offset += g.numel()


def compare_links(fast: str = "1gbit", slow: str = "100mbit", slow_rank: int = 2,
                  world_size: int = 3, steps: int = 6) -> dict:
    """Mean ms per step of every rank: all links ``fast``, then ``slow_rank``'s ``slow``."""
    import ddp_lab
    settings = {"every link " + fast: ddp_lab.Network(fast),
                f"rank {slow_rank} on {slow}": ddp_lab.Network(
                    fast, rank_bandwidth={slow_rank: slow})}
    return {name: [1e3 * sum(t) / len(t) for t in ddp_lab.run(
                step_times, world_size, args=(steps,), network=network, echo=False)]
            for name, network in settings.items()}
