"""Notebook 10 review, cell 7 (and scratch/fsdp.py's docstring): does torch's fully_shard
broadcast parameters or buffers at construction, and does MixedPrecisionPolicy cast buffers?
2 ranks, each builds the model with its own seed (a learner who forgot to seed), a module
with a buffer; then fully_shard and read the full tensors back.
Run: flock /tmp/ddp-lab-cpu.lock .venv/bin/python docs/reviews/repro/10_fully_shard_no_broadcast.py"""
import torch
import torch.nn as nn

import ddp_lab


def rank_fn():
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
    rank = dist.get_rank()
    torch.manual_seed(rank)                        # a different init on each rank
    lin = nn.Linear(2, 4)
    lin.register_buffer("scale", torch.full((2,), float(rank)))
    before = lin.weight.detach().clone()
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    fully_shard(lin, mesh=mesh, mp_policy=MixedPrecisionPolicy(param_dtype=torch.bfloat16))
    full = lin.weight.full_tensor()
    lin(torch.ones(1, 2))
    return {"rows from own init": [torch.equal(full[r], before[r]) for r in range(4)],
            "buffer": lin.scale.tolist(), "buffer dtype": str(lin.scale.dtype)}


if __name__ == "__main__":
    for rank, v in enumerate(ddp_lab.run(rank_fn, world_size=2, echo=False).values):
        print(rank, v)
