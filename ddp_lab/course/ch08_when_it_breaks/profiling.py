"""Notebook 08b, part 1: a ``torch.profiler`` trace of DDP training steps.

What practitioners do first when a distributed job is slow: profile a few steps on every
rank and open the traces in a viewer (https://ui.perfetto.dev, or chrome://tracing). The
profiler is set up as its docs recommend for training loops
(https://pytorch.org/docs/stable/profiler.html): a ``schedule`` that skips warm-up steps,
``prof.step()`` once per step, and ``tensorboard_trace_handler`` writing one Chrome-trace
JSON per rank. ``record_function`` labels forward, backward and the optimizer on the main
thread; the all-reduces show up as ``gloo:all_reduce`` on the process group's own worker
threads, so the trace shows computation and communication side by side, and how much of
the communication backward hid.
"""

from __future__ import annotations

import glob
import os
from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.profiler import (ProfilerActivity, profile, record_function, schedule,
                            tensorboard_trace_handler)

from ddp_lab.course.trace_events import TraceSpan, read_chrome_trace

PHASES = ("forward", "backward", "optimizer")


@dataclass(frozen=True)
class ProfileConfig:
    """An MLP of ``depth`` square layers of ``width`` (one DDP bucket per layer with
    ``bucket_cap_mb``), ``warmup`` steps the profiler skips, then ``active`` recorded."""

    width: int = 512
    depth: int = 4
    batch: int = 64
    bucket_cap_mb: float = 1
    warmup: int = 1
    active: int = 2


def _model(config: ProfileConfig) -> nn.Module:
    torch.manual_seed(0)
    layers = []
    for _ in range(config.depth):
        layers += [nn.Linear(config.width, config.width), nn.ReLU()]
    return nn.Sequential(*layers[:-1])


def profile_ddp_steps(folder: str, config: ProfileConfig = ProfileConfig()) -> str:
    """On each rank: train ``warmup + active`` DDP steps under the profiler, which writes
    this rank's trace into ``folder`` (``rank<r>.<time>.pt.trace.json``). Returns its path."""
    rank = dist.get_rank()
    model = DDP(_model(config), bucket_cap_mb=config.bucket_cap_mb)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    x = torch.randn(config.batch, config.width)
    with profile(activities=[ProfilerActivity.CPU],
                 schedule=schedule(wait=0, warmup=config.warmup, active=config.active),
                 on_trace_ready=tensorboard_trace_handler(folder, worker_name=f"rank{rank}")
                 ) as prof:
        for _ in range(config.warmup + config.active):
            with record_function("forward"):
                loss = model(x).square().mean()
            with record_function("backward"):
                loss.backward()
            with record_function("optimizer"):
                optimizer.step()
                optimizer.zero_grad()
            prof.step()
    return glob.glob(os.path.join(folder, f"rank{rank}.*.pt.trace.json"))[0]


@dataclass(frozen=True)
class StepProfile:
    """One rank's trace reduced to what the figure and the checks need: the main thread's
    phases and backward operators (``autograd::engine::evaluate_function: ...``, the
    Reducer's hooks included), each gloo worker thread's collectives, and the recorded
    steps' extent."""

    phases: tuple[TraceSpan, ...]
    backward_ops: tuple[TraceSpan, ...]
    collectives: tuple[TraceSpan, ...]
    steps: tuple[TraceSpan, ...]

    @property
    def comm_seconds(self) -> float:
        return sum(s.end - s.start for s in self.collectives)

    @property
    def hidden_fraction(self) -> float:
        """Share of the collectives' time that ran while backward operators were still
        computing on the main thread (what overlap hid; the rest is waiting)."""
        hidden = sum(max(0.0, min(c.end, b.end) - max(c.start, b.start))
                     for c in self.collectives for b in self.backward_ops)
        return hidden / self.comm_seconds if self.comm_seconds else 0.0

    def threads(self) -> list[str]:
        """The gloo worker threads that ran collectives, in order of first use."""
        return list(dict.fromkeys(c.thread for c in self.collectives))


def read_profile(path: str) -> StepProfile:
    """The phases, backward operators, collectives and ``ProfilerStep#k`` spans of one
    exported trace."""
    spans = read_chrome_trace(path)
    return StepProfile(
        phases=tuple(s for s in spans if s.name in PHASES and s.category == "user_annotation"),
        backward_ops=tuple(s for s in spans
                           if s.name.startswith("autograd::engine::evaluate_function:")),
        collectives=tuple(s for s in spans if s.name.startswith("gloo:")),
        steps=tuple(s for s in spans if s.name.startswith("ProfilerStep#")))
