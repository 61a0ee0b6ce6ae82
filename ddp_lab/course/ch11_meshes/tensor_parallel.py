"""Tensor parallel on one MLP (notebook 11): the scratch column/row-parallel layers, then
torch's ``parallelize_module`` with ``ColwiseParallel`` / ``RowwiseParallel``
(https://pytorch.org/docs/stable/distributed.tensor.parallel.html), both against the
unsharded MLP on the same input, with the collectives of forward and backward traced.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.device_mesh import init_device_mesh

from ddp_lab import scratch
from ddp_lab.course.collective_trace import CollectiveTrace
from ddp_lab.course.models import MLPConfig, make_mlp


@dataclass(frozen=True)
class TPConfig:
    """The two-layer MLP dim -> hidden -> dim that tensor parallel splits (the course's
    seeded MLP, layers named by index as ``parallelize_module``'s plan names them), and the
    batch it runs on."""

    dim: int = 16
    hidden: int = 64   # divides by 1, 2 and 4 tensor-parallel ranks
    batch: int = 8
    seed: int = 0

    @property
    def mlp(self) -> MLPConfig:
        return MLPConfig(inputs=self.dim, width=self.hidden, depth=2, outputs=self.dim)

    def model(self) -> nn.Sequential:
        """Linear(dim, hidden) - ReLU - Linear(hidden, dim), seeded: the same on every rank."""
        return make_mlp(self.mlp, self.seed, names=False)


def make_input(config: TPConfig, step: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(100 + step)
    return torch.randn(config.batch, config.dim, generator=g)


def unsharded(config: TPConfig = TPConfig()) -> dict:
    """The reference: output, input gradient and weight gradients of the whole MLP."""
    model = config.model()
    x = make_input(config).requires_grad_()
    out = model(x)
    out.square().mean().backward()
    return {"out": out.detach(), "x_grad": x.grad,
            "grads": {k: p.grad for k, p in model.named_parameters()}}


def _run_traced(model: nn.Module, config: TPConfig) -> dict:
    x = make_input(config).requires_grad_()
    with CollectiveTrace(dist.get_world_size()) as forward:
        out = model(x)
    with CollectiveTrace(dist.get_world_size()) as backward:
        out.square().mean().backward()
    local = out.to_local() if hasattr(out, "to_local") else out
    return {"out": local.detach().clone(), "x_grad": x.grad.clone(),
            "forward": [(c.name, c.nbytes) for c in forward.calls],
            "backward": [(c.name, c.nbytes) for c in backward.calls]}


def _full_grads(model: nn.Module) -> dict:
    """Every weight gradient as the full tensor (gathered from the ranks' slices)."""
    grads = {}
    for name, p in model.named_parameters():
        grads[name] = p.grad.full_tensor() if hasattr(p.grad, "full_tensor") else p.grad
    return grads


def scratch_tp(config: TPConfig = TPConfig()) -> dict:
    """The scratch column-then-row parallel MLP; weight gradients gathered from the ranks."""
    full = config.model()
    model = nn.Sequential(scratch.ColumnParallelLinear(full[0]), nn.ReLU(),
                          scratch.RowParallelLinear(full[2]))
    result = _run_traced(model, config)
    result["local_shapes"] = {k: tuple(p.shape) for k, p in model.named_parameters()}
    result["grads"] = {"0.weight": _gather(model[0].weight.grad, 0),
                       "0.bias": _gather(model[0].bias.grad, 0),
                       "2.weight": _gather(model[2].weight.grad, 1),
                       "2.bias": model[2].bias.grad}
    return result


def _gather(t: torch.Tensor, dim: int) -> torch.Tensor:
    pieces = [torch.empty_like(t) for _ in range(dist.get_world_size())]
    dist.all_gather(pieces, t.contiguous())
    return torch.cat(pieces, dim=dim)


def torch_tp(config: TPConfig = TPConfig()) -> dict:
    """The same MLP through ``parallelize_module``: layer 0 colwise, layer 2 rowwise."""
    from torch.distributed.tensor.parallel import (ColwiseParallel, RowwiseParallel,
                                                   parallelize_module)
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    model = parallelize_module(config.model(), mesh,
                               {"0": ColwiseParallel(), "2": RowwiseParallel()})
    result = _run_traced(model, config)
    result["local_shapes"] = {k: tuple(p.to_local().shape) for k, p in model.named_parameters()}
    result["grads"] = _full_grads(model)
    return result


def both(config: TPConfig = TPConfig()) -> dict:
    return {"scratch": scratch_tp(config), "torch": torch_tp(config)}
