"""The all-to-all's share of an expert-parallel step (notebook 13), on loopback and on a
shaped link: forward, backward and the optimizer step of scratch.MoE, with the time spent in
its all-to-alls (dispatch, combine and their backwards) measured apart. Wider tokens than
the routing demo, so that the bytes are large enough for a slow link to show."""

from __future__ import annotations

import time

import torch
import torch.distributed as dist

from ddp_lab.course.ch13_experts.routing import (TrainConfig, clustered_batch, comm_timers,
                                                 sync_gradients)
from ddp_lab import scratch

# 1024 tokens of 256 floats per rank, top-2: each all-to-all moves about 1.5 MiB off every
# rank, well past a shaped link's 256 KiB burst; narrow experts keep the compute small.
WIDE = TrainConfig(d_model=256, d_hidden=64, n_experts=8, capacity_factor=1.25, tokens=1024,
                   clusters=8)


def _off_rank(kept: list[int]) -> int:
    """Rows this rank's dispatch sends to experts on other ranks (experts are split over
    the ranks in contiguous blocks; a rank's own block stays home)."""
    per_rank = len(kept) // dist.get_world_size()
    home = range(dist.get_rank() * per_rank, (dist.get_rank() + 1) * per_rank)
    return sum(n for expert, n in enumerate(kept) if expert not in home)


def step_shares(config: TrainConfig = WIDE, steps: int = 3) -> dict:
    """Per step after the first: seconds of the step and of its all-to-alls, the bytes of
    this rank's dispatch, and those of them bound for other ranks (what crosses its link)."""
    torch.manual_seed(config.seed)
    moe = scratch.MoE(config.d_model, config.d_hidden, config.n_experts, config.top_k,
                      config.capacity_factor)
    optimizer = torch.optim.SGD(moe.parameters(), lr=0.01)
    steps_seen = []
    for step in range(steps + 1):
        x, y = clustered_batch(config, dist.get_rank(), step)
        box = [0.0]
        dist.barrier()
        start = time.perf_counter()
        with comm_timers(box):
            torch.nn.functional.mse_loss(moe(x), y).backward()
        sync_gradients(moe, dist.get_world_size())
        optimizer.step()
        optimizer.zero_grad()
        kept = sum(moe.stats.kept)
        steps_seen.append({"step": time.perf_counter() - start, "comm": box[0],
                           "rows_sent": kept, "bytes_sent": kept * config.d_model * 4,
                           "bytes_off_rank": _off_rank(moe.stats.kept) * config.d_model * 4})
    return {"steps": steps_seen[1:]}
