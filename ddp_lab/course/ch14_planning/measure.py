"""Every plan run for real on this rank (notebook 14): one traced step (which collectives,
on how many bytes, in which group), the bytes of state the rank holds, and step times with
the plans taking turns (``course.timing``), so load from elsewhere hits them all alike."""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.utils.checkpoint import checkpoint

from ddp_lab.course.ch14_planning.plans import PLANS, PlanConfig, build, global_batch, make_model
from ddp_lab.course.collective_trace import CollectiveTrace
from ddp_lab.course.timing import time_in_turns

WARMUP_STEPS = 2  # Adam creates its state in step 0; every plan is in its steady state after


def traced_calls(trace: CollectiveTrace) -> list[tuple[str, int, int]]:
    """(family, bytes of the full tensor, group size) of every collective that moved data,
    sorted: the order of asynchronous calls is not part of the plan."""
    return sorted((c.family, c.nbytes, c.group_size) for c in trace.moving_data())


def state_bytes(built) -> dict:
    """Bytes of parameters, gradients and optimizer state this rank holds after a step: the
    tensors themselves, the gradients read from each held parameter's ``.grad`` (a plan's
    step clears them at its start, not its end, so they are still there)."""
    params = [p for p in built.model.parameters()]
    grads = [p.grad for p in params if p.grad is not None]
    optimizer = getattr(built.optimizer, "local", built.optimizer)
    state = [] if optimizer is None else [
        t for s in optimizer.state.values() for t in s.values()
        if isinstance(t, torch.Tensor) and t.dim() > 0]
    nbytes = lambda ts: sum(t.numel() * t.element_size() for t in ts)  # noqa: E731
    return {"parameters": nbytes(params), "gradients": nbytes(grads),
            "optimizer": nbytes(state)}


def saved_activation_bytes(model: nn.Sequential, x: torch.Tensor, checkpointed: bool) -> int:
    """Bytes autograd keeps for backward in one forward of ``model`` on ``x`` (distinct
    storages, the parameters left out), counted as they are saved (a
    ``saved_tensors_hooks`` pack); ``checkpointed``: each pair of layers (Linear, ReLU,
    Linear, ReLU) under ``torch.utils.checkpoint``, so only what the outer graph keeps is
    counted, each pair's input (the pair rebuilt during backward is not)."""
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    seen = {}

    def pack(t):
        storage = t.untyped_storage()
        if storage.data_ptr() not in params:
            seen[storage.data_ptr()] = storage.nbytes()
        return t
    modules = list(model)
    blocks = [nn.Sequential(*modules[i:i + 4]) for i in range(0, len(modules), 4)]
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        h = x
        for block in blocks:
            h = checkpoint(block, h, use_reentrant=False) if checkpointed else block(h)
    h.sum().backward()
    return sum(seen.values())


def data_parallel_activations(config: PlanConfig) -> dict:
    """{"plain", "checkpointed"}: saved bytes of one data-parallel rank's forward (its share
    of the global batch through the whole MLP)."""
    # a copy: a chunk is a view, and its storage is the whole global batch
    x = global_batch(config, 0)[0].chunk(dist.get_world_size())[dist.get_rank()].clone()
    return {kind: saved_activation_bytes(make_model(config), x, kind == "checkpointed")
            for kind in ("plain", "checkpointed")}


def run_plans(config: PlanConfig = PlanConfig(), names=PLANS, iterations: int = 5) -> dict:
    """On each rank: {plan: {"calls", "state", "ms"}}; ms: the fastest timed step's slowest
    rank (load from elsewhere only ever adds time)."""
    built = {name: build(name, config) for name in names}
    out = {}
    for name, plan in built.items():
        for k in range(WARMUP_STEPS):
            plan.step(k)
        with CollectiveTrace(dist.get_world_size()) as trace:
            plan.step(WARMUP_STEPS)
        out[name] = {"calls": traced_calls(trace), "state": state_bytes(plan)}
    steps = iter(range(WARMUP_STEPS + 1, 10**9))
    times = time_in_turns({name: (lambda p=plan: p.step(next(steps)))
                           for name, plan in built.items()}, 0, iterations)
    for name, seconds in times.items():
        out[name]["ms"] = min(seconds) * 1e3
    return out
