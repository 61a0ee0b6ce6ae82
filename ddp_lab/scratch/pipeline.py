"""Pipeline parallelism in miniature: each rank is one stage (a slice of the layers), the
batch is cut into micro-batches, activations go forward and their gradients backward with
``isend``/``irecv`` between neighbouring ranks.

Two schedules, each a list of ("F", i) / ("B", i) steps per stage:

- GPipe (Huang et al., https://arxiv.org/abs/1811.06965): every forward, then every
  backward. Simple, but a stage keeps the activations of all m micro-batches.
- 1F1B (PipeDream-Flush, Narayanan et al., https://arxiv.org/abs/2006.09503): after a short
  warm-up of forwards, each stage alternates one forward and one backward, so it keeps at
  most p micro-batches in flight. The idle "bubble" is the same: (p-1)/(m+p-1) of the time.
"""

from __future__ import annotations

import time

import torch
import torch.distributed as dist
import torch.nn as nn


def gpipe_schedule(stages: int, microbatches: int, stage: int) -> list[tuple[str, int]]:
    return [("F", i) for i in range(microbatches)] + [("B", i) for i in range(microbatches)]


def one_f_one_b_schedule(stages: int, microbatches: int, stage: int) -> list[tuple[str, int]]:
    warmup = min(stages - stage - 1, microbatches)
    steps = [("F", i) for i in range(warmup)]
    for i in range(microbatches - warmup):
        steps += [("F", warmup + i), ("B", i)]
    return steps + [("B", i) for i in range(microbatches - warmup, microbatches)]


SCHEDULES = {"GPipe": gpipe_schedule, "1F1B": one_f_one_b_schedule}


class PipelineStage:
    """This rank's ``module`` as stage ``dist.get_rank()`` of ``dist.get_world_size()``.
    ``run(schedule, inputs, targets, loss_fn)`` runs one training step's forwards and
    backwards (stage 0 reads ``inputs``, the last stage ``targets``); the loss is the mean
    over micro-batches. Returns the loss (last stage) and a timeline of (step, start, end)
    where a step starts once its input arrived: waiting for a neighbour is the bubble."""

    def __init__(self, module: nn.Module, activation_shape: tuple[int, ...]):
        self.module = module
        self.shape = activation_shape
        self.stage, self.stages = dist.get_rank(), dist.get_world_size()

    def run(self, schedule: str, inputs: list, targets: list, loss_fn) -> dict:
        steps = SCHEDULES[schedule](self.stages, len(inputs), self.stage)
        saved, sends, timeline, losses, in_flight = {}, [], [], [], 0
        for kind, i in steps:
            if kind == "F":
                saved[i], start = self._forward(inputs, targets, loss_fn, i, sends, losses)
                in_flight = max(in_flight, len(saved))
            else:
                start = self._backward(saved.pop(i), sends)
            timeline.append((f"{kind}{i}", start, time.time()))
        for work in sends:
            work.wait()
        return {"loss": sum(losses) if losses else None, "timeline": timeline,
                "peak_in_flight": in_flight}  # micro-batches whose activations were kept

    def _forward(self, inputs, targets, loss_fn, i, sends, losses):
        if self.stage == 0:
            x = inputs[i]
        else:
            x = torch.empty(self.shape)
            dist.recv(x, src=self.stage - 1)
            x.requires_grad_()
        start = time.time()
        out = self.module(x)
        if self.stage == self.stages - 1:
            out = loss_fn(out, targets[i]) / len(inputs)
            losses.append(out.item())
        else:
            sends.append(dist.isend(out.detach().contiguous(), dst=self.stage + 1))
        return (x, out), start

    def _backward(self, saved, sends):
        x, out = saved
        if self.stage == self.stages - 1:
            start = time.time()
            out.backward()
        else:
            grad = torch.empty_like(out)
            dist.recv(grad, src=self.stage + 1)
            start = time.time()
            out.backward(grad)
        if self.stage > 0:
            sends.append(dist.isend(x.grad.contiguous(), dst=self.stage - 1))
        return start
