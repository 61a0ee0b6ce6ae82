"""Notebook 12: the same sequence-parallel block with torch's own styles, and the
vocabulary-parallel loss.

``parallelize_module`` with ``SequenceParallel`` on the LayerNorm (its input and output
sharded along the sequence), ``ColwiseParallel(input_layouts=Shard(0))`` on the first linear
(the all-gather in) and ``RowwiseParallel(output_layouts=Shard(0))`` on the second (the
reduce-scatter out) is megatron_sp.py's hand-written version (torch/distributed/tensor/
parallel/style.py). ``loss_parallel()`` (torch/distributed/tensor/parallel/loss.py) lets
``F.cross_entropy`` take logits sharded along the classes: each rank reduces its own slice
(a max and a sum of exponentials, all-reduced across ranks) instead of gathering the logits.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor, Shard
from torch.distributed.tensor.parallel import (ColwiseParallel, RowwiseParallel,
                                               SequenceParallel, loss_parallel,
                                               parallelize_module)

from ddp_lab.course.ch12_sequence.megatron_sp import BlockConfig, make_block, make_input
from ddp_lab.course.collective_trace import CollectiveTrace


class Block(nn.Module):
    """megatron_sp's block (LayerNorm, up, GELU, down) as a module torch's styles can take."""

    def __init__(self, config: BlockConfig):
        super().__init__()
        parts = make_block(config)
        self.norm, self.up, self.down = parts["norm"], parts["up"], parts["down"]

    def forward(self, x):
        return self.down(F.gelu(self.up(self.norm(x))))


def torch_sequence_parallel(config: BlockConfig = BlockConfig()) -> dict:
    """The block through parallelize_module, input sharded along the sequence (dim 0)."""
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    block = parallelize_module(Block(config), mesh, {
        "norm": SequenceParallel(sequence_dim=0),
        "up": ColwiseParallel(input_layouts=Shard(0)),
        "down": RowwiseParallel(output_layouts=Shard(0), use_local_output=False)})
    x = make_input(config).chunk(dist.get_world_size())[dist.get_rank()].clone().requires_grad_()
    with CollectiveTrace() as forward:
        out = block(DTensor.from_local(x, mesh, [Shard(0)]))
    with CollectiveTrace() as backward:
        out.to_local().square().sum().backward()
    return {"out": out.to_local().detach().clone(), "x_grad": x.grad,
            "norm_grad": block.norm.weight.grad.full_tensor(),
            "out_placements": [str(p) for p in out.placements],
            "forward": forward.family_counts(), "backward": backward.family_counts()}


def vocab_parallel_loss(batch: int = 6, classes: int = 12, seed: int = 0) -> dict:
    """Cross-entropy on logits sharded along the classes, against one process's."""
    generator = torch.Generator().manual_seed(seed)
    logits = torch.randn(batch, classes, generator=generator)
    labels = torch.randint(classes, (batch,), generator=generator)
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    mine = logits.chunk(dist.get_world_size(), dim=1)[dist.get_rank()].clone().requires_grad_()
    sharded = DTensor.from_local(mine, mesh, [Shard(1)])
    with loss_parallel(), CollectiveTrace() as trace:
        loss = F.cross_entropy(sharded, labels)
        loss.backward()
    full = logits.clone().requires_grad_()
    expected = F.cross_entropy(full, labels)
    expected.backward()
    return {"loss": float(loss.full_tensor()), "expected": float(expected),
            "grad_equal": torch.allclose(mine.grad, full.grad.chunk(dist.get_world_size(),
                                                                    dim=1)[dist.get_rank()],
                                         atol=1e-6),
            "collectives": trace.family_counts(), "logits_gathered": any(
                c.family == "all_gather" for c in trace.calls)}
