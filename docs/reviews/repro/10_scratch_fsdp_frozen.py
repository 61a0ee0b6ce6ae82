"""Notebook 10 review, scratch.FSDP (cells 7-8): a learner freezes the first layer
(requires_grad_(False), as in fine-tuning) and wraps the model. Does the frozen layer stay
frozen? 2 ranks, 3 Adam steps, compared with one process training the same frozen model.
Run: flock /tmp/ddp-lab-cpu.lock .venv/bin/python docs/reviews/repro/10_scratch_fsdp_frozen.py"""
import torch
import torch.nn as nn

import ddp_lab


def model():
    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(4, 6), nn.ReLU(), nn.Linear(6, 2))
    m[0].requires_grad_(False)
    return m


def batch(step):
    g = torch.Generator().manual_seed(step)
    return torch.randn(8, 4, generator=g), torch.randn(8, 2, generator=g)


def rank_fn():
    import torch.distributed as dist
    from ddp_lab import scratch
    rank, world = dist.get_rank(), dist.get_world_size()
    m = model()
    before = m[0].weight.detach().clone()
    f = scratch.FSDP(m)
    opt = torch.optim.Adam(f.parameters(), lr=0.1)
    for step in range(3):
        x, y = batch(step)
        nn.functional.mse_loss(f(x.chunk(world)[rank]), y.chunk(world)[rank]).backward()
        f.sync_gradients()
        opt.step()
        opt.zero_grad()
    full = scratch.full_state_dict(f)
    return {"shards requiring grad": [p.requires_grad for p in f.parameters()],
            "frozen 0.weight moved by": (full["0.weight"] - before).abs().max().item()}


if __name__ == "__main__":
    ref = model()
    before = ref[0].weight.detach().clone()
    opt = torch.optim.Adam([p for p in ref.parameters() if p.requires_grad], lr=0.1)
    for step in range(3):
        x, y = batch(step)
        nn.functional.mse_loss(ref(x), y).backward()
        opt.step()
        opt.zero_grad()
    print("one process: frozen 0.weight moved by", (ref[0].weight - before).abs().max().item())
    for rank, v in enumerate(ddp_lab.run(rank_fn, world_size=2, echo=False).values):
        print("scratch.FSDP rank", rank, v)
