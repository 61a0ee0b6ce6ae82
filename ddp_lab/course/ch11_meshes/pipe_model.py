"""The model notebook 11b pipelines: blocks of ``Linear`` + ``Tanh`` whose compute is
paced, cut into stages, with its one-process reference and notebook 11's from-scratch
pipeline (``scratch.PipelineStage``) run on it. Nothing here imports
``torch.distributed.pipelining``.

Compute is paced: every layer also sleeps a fixed time in forward, in its input-gradient
backward and in its weight-gradient backward, as a GPU's kernels would take, so that the
timelines show the schedules and not the other processes on a shared 2-core laptop. The
sleeps sit in autograd nodes, so the split backward of the zero-bubble schedules really
runs them in two parts.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

from ddp_lab import scratch


@dataclass(frozen=True)
class Pace:
    """Seconds each layer sleeps: in forward, in the backward to its input (I), and in the
    backward to its weight (W). A full backward (B) takes I + W."""
    forward: float = 0.004
    input_grad: float = 0.004
    weight_grad: float = 0.004


@dataclass(frozen=True)
class PipeliningConfig:
    width: int = 32
    layers_per_rank: int = 2     # the whole model has layers_per_rank x ranks layers
    microbatches: int = 8
    microbatch_rows: int = 16
    pace: Pace = field(default_factory=Pace)
    seed: int = 0


class _Sleep(torch.autograd.Function):
    """Identity; sleeps ``forward_s`` going forward and ``backward_s`` coming back."""

    @staticmethod
    def forward(ctx, x, forward_s, backward_s):
        ctx.backward_s = backward_s
        if forward_s:  # sleep(0) still yields the core: slow on a busy machine
            time.sleep(forward_s)
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        if ctx.backward_s:
            time.sleep(ctx.backward_s)
        return grad, None, None


class PacedLinear(nn.Linear):
    """``nn.Linear`` (same initialisation, same result) whose compute takes ``pace``: the
    weight's own sleep node lies only on the path to the weight's gradient, the output's
    only on the path to the input's, the split that zero-bubble schedules make."""

    def __init__(self, width: int, pace: Pace):
        super().__init__(width, width)
        self.pace = pace

    def forward(self, x):
        weight = _Sleep.apply(self.weight, 0.0, self.pace.weight_grad)
        return _Sleep.apply(F.linear(x, weight, self.bias), self.pace.forward, self.pace.input_grad)


def make_layers(config: PipeliningConfig, ranks: int, pace: Pace | None = None) -> list[nn.Module]:
    """The whole model's layers (Linear + Tanh each), the same for every schedule."""
    torch.manual_seed(config.seed)
    pace = config.pace if pace is None else pace
    return [nn.Sequential(PacedLinear(config.width, pace), nn.Tanh())
            for _ in range(config.layers_per_rank * ranks)]


def cut(layers: list[nn.Module], stages: int) -> list[nn.Sequential]:
    """``stages`` consecutive slices of the layers."""
    per = len(layers) // stages
    return [nn.Sequential(*layers[i * per:(i + 1) * per]) for i in range(stages)]


def batch(config: PipeliningConfig) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(config.seed + 1)
    rows = config.microbatches * config.microbatch_rows
    return torch.randn(rows, config.width, generator=g), torch.randn(rows, config.width, generator=g)


def reference(config: PipeliningConfig, ranks: int) -> dict:
    """One process, every layer in a row, no pacing: the mean of the micro-batches' MSE and
    each layer's gradients."""
    layers = make_layers(config, ranks, Pace(0.0, 0.0, 0.0))
    model = nn.Sequential(*layers)
    x, y = batch(config)
    xs, ys = x.chunk(config.microbatches), y.chunk(config.microbatches)
    loss = sum(F.mse_loss(model(a), b) for a, b in zip(xs, ys)) / config.microbatches
    loss.backward()
    return {"loss": loss.item(), "grads": [[p.grad.clone() for p in l.parameters()] for l in layers]}


def run_scratch(name: str, config: PipeliningConfig) -> dict:
    """Notebook 11's ``scratch.PipelineStage`` (one stage per rank) on the same model and
    micro-batches as the library's schedules: its spans, gradients and loss."""
    rank, ranks = dist.get_rank(), dist.get_world_size()
    x, y = batch(config)
    xs, ys = list(x.chunk(config.microbatches)), list(y.chunk(config.microbatches))
    module = cut(make_layers(config, ranks), ranks)[rank]
    stage = scratch.PipelineStage(module, (config.microbatch_rows, config.width))
    stage.run(name, xs, ys, F.mse_loss)          # warm-up, as the library's first step
    module.zero_grad()
    dist.barrier()
    run = stage.run(name, xs, ys, F.mse_loss)
    return {"spans": run["timeline"], "loss": run["loss"],
            "grads": [[p.grad.clone() for p in layer.parameters()] for layer in module]}


def scratch_steps(config: PipeliningConfig = PipeliningConfig()) -> dict:
    """On each rank: notebook 11's GPipe and 1F1B on this model."""
    return {name: run_scratch(name, config) for name in ("GPipe", "1F1B")}
