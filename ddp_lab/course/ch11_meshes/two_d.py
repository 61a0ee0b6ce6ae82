"""2-D parallelism (notebook 11): data parallel along the mesh's "dp" dimension, tensor
parallel along "tp", on 4 ranks as a 2 x 2 mesh. Each "tp" pair holds one copy of the MLP,
split column/row-wise by ``parallelize_module``, and trains on its own rows of the global
batch; FSDP2's ``fully_shard`` on the "dp" sub-mesh then shards each tensor-parallel slice
again over the data-parallel ranks and averages their gradients (FSDP + TP as in
https://pytorch.org/tutorials/intermediate/TP_tutorial.html, in its smallest form: the
tutorial shards every block and then the root; ``fully_shard`` on the root only makes the
whole MLP one unit, enough for a correctness check).
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn as nn

from ddp_lab.course.ch11_meshes.meshes import make_mesh
from ddp_lab.course.ch11_meshes.tensor_parallel import TPConfig
from ddp_lab.course.one_process import one_process_training

TRAIN = TPConfig(dim=16, hidden=64, batch=8)
STEPS, LR = 3, 0.05


def global_batch(config: TPConfig, step: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(7 + step)
    return (torch.randn(config.batch, config.dim, generator=g),
            torch.randn(config.batch, config.dim, generator=g))


def reference(config: TPConfig = TRAIN, steps: int = STEPS) -> dict:
    """One process, the whole batch, SGD: losses and final parameters."""
    model = config.model()
    optimizer = torch.optim.SGD(model.parameters(), lr=LR)
    return one_process_training(model, optimizer, (global_batch(config, s) for s in range(steps)))


def train_2d(config: TPConfig = TRAIN, steps: int = STEPS) -> dict:
    """On each rank of a 2 x 2 mesh: the global losses and the full final parameters."""
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor.parallel import (ColwiseParallel, RowwiseParallel,
                                                   parallelize_module)
    mesh = make_mesh()
    model = parallelize_module(config.model(), mesh["tp"],
                               {"0": ColwiseParallel(), "2": RowwiseParallel()})
    fully_shard(model, mesh=mesh["dp"])
    optimizer = torch.optim.SGD(model.parameters(), lr=LR)
    dp_rank, dp_size = mesh.get_local_rank("dp"), mesh.size(0)
    losses = []
    for step in range(steps):
        x, y = (t.chunk(dp_size)[dp_rank] for t in global_batch(config, step))
        loss = nn.functional.mse_loss(model(x), y)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        total = loss.detach().clone()
        dist.all_reduce(total, group=mesh.get_group("dp"))
        losses.append(total.item() / dp_size)
    params = {k: v.full_tensor().detach().clone() for k, v in model.state_dict().items()}
    return {"coordinate": mesh.get_coordinate(), "losses": losses, "params": params,
            "placements": {k: str(v.placements) for k, v in model.state_dict().items()}}
