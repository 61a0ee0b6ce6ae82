"""Notebook 13 review, cells 6 and 8: what happens if a learner wraps the expert-parallel
scratch.MoE in DDP over all ranks, as notebooks 05-07 taught for every model. Each rank holds
different experts with the same shapes, so DDP's construction-time shape check passes, its
broadcast copies rank 0's experts over every rank's own, and its all-reduce averages
different experts' gradients. 2 ranks, 4 experts (2 per rank).
Run: PYTHONPATH=<tree> python docs/reviews/repro/13_ddp_over_experts.py"""
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

import ddp_lab
from ddp_lab import scratch


def trial():
    torch.manual_seed(0)
    moe = scratch.MoE(8, 16, 4, top_k=2)
    mine = moe.experts[0][0].weight.detach().clone()          # this rank's first expert, as built
    try:
        model = DDP(moe)
    except Exception as e:  # noqa: BLE001
        return f"DDP refused: {type(e).__name__}: {str(e).splitlines()[0][:200]}"
    after = moe.experts[0][0].weight.detach()
    rebuilt = scratch.moe.expert_with_seed(8, 16, moe.expert_seed + moe.first_expert)[0].weight
    x = torch.randn(6, 8, generator=torch.Generator().manual_seed(dist.get_rank()))
    model(x).square().sum().backward()
    return (f"holds expert {moe.first_expert}; DDP accepted it; its weight after DDP() equals the one built "
            f"for it: {torch.equal(after, mine) and torch.equal(after, rebuilt)}")


if __name__ == "__main__":
    for rank, line in enumerate(ddp_lab.run(trial, world_size=2, echo=False, timeout=60).values):
        print(f"rank {rank}: {line}")
