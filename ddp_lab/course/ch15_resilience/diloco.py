"""Fewer synchronisations on a slow link (notebook 15): DDP, LocalSGD and DiLoCo on the same
data, the bytes each all-reduces and the time each takes.

- DDP all-reduces the gradients at every step (``DistributedDataParallel``), one all-reduce
  per bucket: its first iteration has one bucket of every parameter
  (torch/nn/parallel/distributed.py:154), then it rebuilds them once, before the second
  forward (:1769-1775), in backward's order with a first bucket of about 1 MiB
  (``dist._DEFAULT_FIRST_BUCKET_BYTES``) and 25 MiB ones after it: on this 1.29 MB model, one
  all-reduce at step 1 and two at every later step (``per_step``).
- LocalSGD (Lin et al. 2018, https://arxiv.org/abs/1808.07217) lets every rank take
  ``period`` steps alone and then averages the parameters. torch ships it:
  ``PostLocalSGDOptimizer`` (torch/distributed/optim/post_localSGD_optimizer.py:100-105:
  ``step()`` runs the wrapped optimizer, then ``averager.average_parameters``) with a
  ``PeriodicModelAverager`` (torch/distributed/algorithms/model_averaging/averagers.py:108-127:
  averages when ``step >= warmup_steps`` and ``(step - warmup_steps) % period == 0``; one
  all-reduce of the flattened parameters divided by the world size,
  model_averaging/utils.py:21-49). torch's recipe is hierarchical: DDP with
  ``post_localSGD_hook`` all-reduces the gradients over all ranks during the warm-up
  (ddp_comm_hooks/post_localSGD_hook.py:106), and after it, by default, still every step
  inside a subgroup, one per machine (``dist.new_subgroups()``, :123); the averager adds the
  average over all every ``period`` steps. With ``warmup_steps=0`` and no DDP, as here, the
  ranks never sync gradients, only parameters, every ``period`` steps (its step 0 included).
- DiLoCo (Douillard et al. 2023, https://arxiv.org/abs/2311.08105) also takes ``period``
  inner steps alone, then treats ``outer - local`` (the pseudo-gradient) averaged over the
  ranks as the gradient of an outer SGD with Nesterov momentum: the averaging is the same
  all-reduce as LocalSGD's, the outer optimizer is what differs. Written here from scratch
  (``outer_step``), the exercise of the notebook.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.algorithms.model_averaging.averagers import PeriodicModelAverager
from torch.distributed.optim import PostLocalSGDOptimizer
from torch.nn.parallel import DistributedDataParallel as DDP

from ddp_lab.course.ch15_resilience.workload import rank_slice, regression_data
from ddp_lab.course.collective_trace import CollectiveTrace
from ddp_lab.course.models import MLPConfig, make_mlp

METHODS = ("DDP", "LocalSGD", "DiLoCo")


@dataclass(frozen=True)
class SyncConfig:
    """What every method trains: the same model, data, inner optimizer and steps."""

    model: MLPConfig = MLPConfig(inputs=64, width=384, depth=4, outputs=8)
    steps: int = 48
    period: int = 8          # inner steps between two synchronisations (LocalSGD, DiLoCo)
    batch: int = 16          # rows per rank per step
    lr: float = 0.05         # inner SGD (momentum 0.9): the one optimizer of DDP
    outer_lr: float = 0.7    # DiLoCo's outer SGD: the paper's 0.7 and Nesterov momentum 0.9
    outer_momentum: float = 0.9


def outer_step(outer: list, local: list, momenta: list, outer_lr: float, momentum: float):
    """DiLoCo's outer step: mean over the ranks of the pseudo-gradient ``outer - local``
    (one all-reduce of them all, flattened), then SGD with Nesterov momentum on ``outer``
    (torch/optim/sgd.py:364-367). Returns the new outer parameters and momenta."""
    deltas = torch.cat([(o - p).reshape(-1) for o, p in zip(outer, local)])
    dist.all_reduce(deltas)
    deltas /= dist.get_world_size()
    new_outer, new_momenta, offset = [], [], 0
    for o, buf in zip(outer, momenta):
        delta = deltas[offset:offset + o.numel()].view_as(o)
        offset += o.numel()
        buf = momentum * buf + delta
        new_momenta.append(buf)
        new_outer.append(o - outer_lr * (delta + momentum * buf))
    return new_outer, new_momenta


class DiLoCo:
    """Inner SGD steps on this rank alone; every ``period`` steps, ``outer_step`` and the
    local parameters set to the new outer ones."""

    def __init__(self, model, config: SyncConfig):
        self.params = list(model.parameters())
        self.inner = torch.optim.SGD(self.params, lr=config.lr, momentum=0.9)
        self.outer = [p.detach().clone() for p in self.params]
        self.momenta = [torch.zeros_like(p) for p in self.params]
        self.config, self.steps = config, 0

    def zero_grad(self):
        self.inner.zero_grad()

    def step(self):
        self.inner.step()
        self.steps += 1
        if self.steps % self.config.period == 0:
            with torch.no_grad():
                local = [p.detach() for p in self.params]
                self.outer, self.momenta = outer_step(self.outer, local, self.momenta,
                                                      self.config.outer_lr,
                                                      self.config.outer_momentum)
                for p, o in zip(self.params, self.outer):
                    p.copy_(o)


def _set_up(method: str, config: SyncConfig):
    """(the module to call, the optimizer) of ``method``, from the same seeded weights."""
    model = make_mlp(config.model)
    if method == "DDP":
        ddp = DDP(model)
        return ddp, torch.optim.SGD(ddp.parameters(), lr=config.lr, momentum=0.9)
    if method == "LocalSGD":
        inner = torch.optim.SGD(model.parameters(), lr=config.lr, momentum=0.9)
        return model, PostLocalSGDOptimizer(inner, PeriodicModelAverager(config.period))
    if method == "DiLoCo":
        return model, DiLoCo(model, config)
    raise ValueError(f"method {method!r} is not one of {METHODS}")


def train(method: str, config: SyncConfig = SyncConfig()) -> dict:
    """On each rank: ``config.steps`` steps of ``method`` on this rank's rows of the shared
    regression task. Its losses (this rank's batch), the seconds, the bytes and the number of
    all-reduces it issued (in all and at each step), and its first final parameters."""
    module, optimizer = _set_up(method, config)
    x, y = regression_data(config.model, config.steps * config.batch * dist.get_world_size())
    dist.barrier()
    losses, per_step, start = [], [], time.perf_counter()
    with CollectiveTrace() as trace:
        for step in range(config.steps):
            optimizer.zero_grad()
            loss = F.mse_loss(module(rank_slice(x, step, config.batch)),
                              rank_slice(y, step, config.batch))
            loss.backward()
            optimizer.step()
            losses.append(loss.item())
            per_step.append(len(trace.of("all_reduce")) - sum(per_step))
    seconds = time.perf_counter() - start
    reduces = trace.of("all_reduce")
    params = torch.cat([p.detach().reshape(-1) for p in module.parameters()])
    return {"method": method, "loss": losses, "seconds": seconds,
            "bytes": sum(c.nbytes for c in reduces), "all_reduces": len(reduces),
            "per_step": per_step,
            "param_bytes": params.numel() * params.element_size(),
            "params": params[:64].clone()}


def compare(config: SyncConfig = SyncConfig()) -> dict:
    """Every method, one after another in the same ranks: {method: this rank's result}."""
    return {method: train(method, config) for method in METHODS}


def mean_loss(per_rank: list, method: str) -> list[float]:
    """The loss of the global batch at each step: the mean of the ranks' (equal batches)."""
    curves = [r[method]["loss"] for r in per_rank]
    return [sum(values) / len(values) for values in zip(*curves)]
