"""Notebook 11 review, exercise 11.row_parallel: the reference/recipe's
`partial + (total - partial).detach()` "has the value of the sum". Is it the same bits on
every rank? 2 and 4 ranks, random float32 inputs; compare each rank's output with rank 0's and
with the all-reduced sum itself.
Run: flock /tmp/ddp-lab-cpu.lock .venv/bin/python docs/reviews/repro/11_detach_trick_bits.py"""
import torch

import ddp_lab


def rank_fn():
    import torch.distributed as dist
    from ddp_lab.course.ch11_meshes.exercises import row_parallel_linear
    from ddp_lab import scratch
    rank, world = dist.get_rank(), dist.get_world_size()
    g = torch.Generator().manual_seed(0)
    x = torch.randn(64, 32 * world, generator=g)
    w = torch.randn(48, 32 * world, generator=g)
    b = torch.randn(48, generator=g)
    xs, ws = x.chunk(world, 1)[rank], w.chunk(world, 1)[rank]
    out = row_parallel_linear(xs, ws.requires_grad_(), b).detach()
    partial = xs @ ws.detach().T
    total = partial.clone()
    dist.all_reduce(total)
    exact = total + b                                   # what scratch's g then + bias gives
    fixed = total + (partial - partial.detach()) + b    # the value-exact form of the trick
    outs = [torch.empty_like(out) for _ in range(world)]
    dist.all_gather(outs, out)
    return {"differs from sum+b (elements)": int((out != exact).sum()),
            "differs from rank 0's output (elements)": int((out != outs[0]).sum()),
            "value-exact form differs from sum+b (elements)": int((fixed != exact).sum()),
            "of": out.numel()}


if __name__ == "__main__":
    for n in (2, 4):
        for rank, v in enumerate(ddp_lab.run(rank_fn, world_size=n, echo=False).values):
            print(n, "ranks, rank", rank, v)
