"""Every plan run for real on this rank (notebook 14): one traced step (which collectives,
on how many bytes, in which group), the bytes of state the rank holds, and step times with
the plans taking turns (``course.timing``), so load from elsewhere hits them all alike."""

from __future__ import annotations

import torch
import torch.distributed as dist

from ddp_lab.course.ch14_planning.plans import PLANS, PlanConfig, build
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
