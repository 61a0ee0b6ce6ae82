"""Communication hooks: what DDP sends for each bucket, replaced (notebook 07).

``ddp.register_comm_hook(state, hook)`` swaps the Reducer's all-reduce for
``hook(state, bucket)``, which must return a ``torch.futures.Future`` whose value is the
bucket's new (averaged) content. Built in: ``default_hooks.allreduce_hook`` (what DDP does
anyway), ``fp16_compress_hook`` (send half the bytes), ``powerSGD_hook`` (send low-rank
factors, Vogels et al. 2019). ``int8_hook`` below is a custom one.

To count what really goes over the wire, ``counting_all_reduce`` watches every all-reduce
issued while it is active with ``CollectiveTrace``, the course's dispatcher-level instrument:
the hooks' own calls, however they reach the process group, and those PowerSGD issues from
``Future.then`` callbacks on gloo's worker thread (the trace follows them there). DDP without
a hook counts too: its Reducer's all-reduce reaches the dispatcher as well.
"""

from __future__ import annotations

import os
from contextlib import contextmanager

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook
from torch.nn.parallel import DistributedDataParallel as DDP

from ddp_lab.course.ch07_inside_ddp.workload import hook_device, rank_slice, regression_data
from ddp_lab.course.collective_trace import CollectiveTrace
from ddp_lab.course.models import MLPConfig, make_mlp
from ddp_lab.course.params import device_ids

HOOK_MODEL = MLPConfig(inputs=64, width=256, depth=3, outputs=8)


@contextmanager
def counting_all_reduce():
    """Yield {"calls", "bytes"}: the all-reduces issued while active, filled in on leaving."""
    counts = {"calls": 0, "bytes": 0}
    with CollectiveTrace() as trace:
        yield counts
    all_reduces = trace.of("all_reduce")
    counts.update(calls=len(all_reduces), bytes=sum(call.nbytes for call in all_reduces))


def int8_hook(process_group, bucket):
    """A custom hook: send one byte per gradient instead of four.

    The ranks first agree on a scale (an all-reduce MAX of one number), then each sends
    its gradient rounded to an int8 grid coarse enough that the SUM of ``world`` of them
    still fits in int8. No error feedback: what rounds away is lost."""
    group = process_group if process_group is not None else dist.group.WORLD
    world, buffer = group.size(), bucket.buffer()
    scale = buffer.abs().max().reshape(1).clamp_min(torch.finfo(buffer.dtype).tiny)
    dist.all_reduce(scale, op=dist.ReduceOp.MAX, group=group)  # tiny, so synchronous
    levels = 127 // world
    quantized = (buffer / scale * levels).round_().to(torch.int8)
    future = dist.all_reduce(quantized, group=group, async_op=True).get_future()

    def decompress(fut):
        return buffer.copy_(fut.value()[0]).mul_(scale / (levels * world))

    return future.then(decompress)


def _powersgd():
    """Rank-1 PowerSGD after two plain iterations (it needs the rebuilt buckets first)."""
    state = powerSGD_hook.PowerSGDState(process_group=None, matrix_approximation_rank=1,
                                        start_powerSGD_iter=2, min_compression_rate=2)
    return state, powerSGD_hook.powerSGD_hook


HOOKS = {
    "all-reduce (default)": lambda: (None, default_hooks.allreduce_hook),
    "fp16 compression": lambda: (None, default_hooks.fp16_compress_hook),
    "PowerSGD rank 1": _powersgd,
    "int8 (custom)": lambda: (None, int8_hook),
}


def train_with_hook(name: str, config: MLPConfig = HOOK_MODEL, steps: int = 40,
                    batch: int = 32, lr: float = 0.1) -> dict:
    """On each rank: train the regression task with hook ``name``, on ``hook_device`` (a
    GPU wherever there is one: PowerSGD fails on CPU tensors there); per step the loss of
    the global batch, and the all-reduce calls and bytes this rank sent in backward."""
    device = _device()
    model = make_mlp(config).to(device)
    ddp = DDP(model, device_ids=device_ids(device))
    ddp.register_comm_hook(*HOOKS[name]())
    optimizer = torch.optim.SGD(ddp.parameters(), lr=lr, momentum=0.9)
    x, y = (t.to(device) for t in regression_data(config, steps * batch * dist.get_world_size()))
    out = {"loss": [], "calls": [], "bytes": [], "device": str(device)}
    for step in range(steps):
        optimizer.zero_grad()
        with counting_all_reduce() as counts:
            loss = F.mse_loss(ddp(rank_slice(x, step, batch)), rank_slice(y, step, batch))
            loss.backward()
        optimizer.step()
        out["loss"].append(_global_mean(loss))
        out["calls"].append(counts["calls"])
        out["bytes"].append(counts["bytes"])
    return out


def _device() -> torch.device:
    device = hook_device(dist.get_backend(), torch.cuda.device_count(),
                         int(os.environ.get("LOCAL_RANK", 0)))
    if device.type == "cuda":
        torch.cuda.set_device(device)  # the rank's CUDA context on its GPU, not always GPU 0
    return device


def compare_hooks(names=tuple(HOOKS), steps: int = 40) -> dict:
    """``train_with_hook`` for each hook in one launch: {name: its result}."""
    return {name: train_with_hook(name, steps=steps) for name in names}


def _global_mean(loss: torch.Tensor) -> float:
    total = loss.detach().clone()
    dist.all_reduce(total)
    return total.item() / dist.get_world_size()


def hook_summary(steps: int = 40) -> dict:
    """``ddp-lab run comm_hooks``: per hook, bytes all-reduced per step and final loss."""
    return {name: {"bytes_per_step": r["bytes"][-1], "final_loss": round(r["loss"][-1], 4)}
            for name, r in compare_hooks(steps=steps).items()}
