"""What the time model needs from this machine, measured on the 4 ranks of the run (all at
once, as in training, so the shared cores are in the numbers):

- each collective's seconds at a few sizes, on the shaped link, for every (family, group
  size) the plans use; ``fit`` turns them into alpha + beta x bytes (notebook 04's least
  squares on relative error, ``fit_alpha_beta``);
- the seconds of one Linear's forward and backward at each (rows, fan_in, fan_out) the
  plans compute, and of Adam's step per parameter;
- one slot of the pipeline at both ends of its schedule: with one stage busy (a micro-batch
  through the stages and back, per stage) and with every stage busy at once.
"""

from __future__ import annotations

import time

import torch
import torch.distributed as dist
import torch.nn as nn

from ddp_lab.course.alpha_beta import AlphaBeta, fit_alpha_beta

KINDS = (("all_reduce", 4), ("all_reduce", 2), ("all_gather", 4), ("reduce_scatter", 4),
         ("broadcast", 4))
KiB = 1 << 10
SIZES = (1 * KiB, 16 * KiB, 64 * KiB, 256 * KiB, 1024 * KiB)
CALLS = 4
BURSTS = 3


def _collective(family: str, nbytes: int, groups: dict):
    """A callable that runs one ``family`` collective on a tensor of ``nbytes`` (the full
    tensor, as the trace counts it) in this rank's group of the right size."""
    world = dist.get_world_size()
    full = torch.ones(nbytes // 4)
    part = torch.empty(nbytes // 4 // world)
    calls = {
        "all_reduce": lambda g: dist.all_reduce(full, group=g),
        "all_gather": lambda g: dist.all_gather_into_tensor(full, part, group=g),
        "reduce_scatter": lambda g: dist.reduce_scatter_tensor(part, full, group=g),
        "broadcast": lambda g: dist.broadcast(full, src=0, group=g),
    }
    return calls[family]


def _burst_seconds(call, group) -> float:
    """Seconds per call of CALLS calls back to back, started together."""
    dist.barrier()
    start = time.perf_counter()
    for _ in range(CALLS):
        call(group)
    dist.barrier()
    return (time.perf_counter() - start) / CALLS


def collective_seconds() -> dict:
    """On each rank: {"family/group size": [seconds per call at each of SIZES]}: the fastest
    of BURSTS bursts of CALLS back-to-back calls, after one untimed call (load from
    elsewhere only ever adds time, as for the plans' steps). Groups of 2 are {0, 1} and
    {2, 3}, busy at the same time."""
    pairs = [dist.new_group([0, 1]), dist.new_group([2, 3])]
    groups = {4: None, 2: pairs[dist.get_rank() // 2]}
    out = {}
    for family, size in KINDS:
        times = {}
        for nbytes in reversed(SIZES):  # the smallest last: the connections are warm by then
            call = _collective(family, nbytes, groups)
            call(groups[size])
            times[nbytes] = min(_burst_seconds(call, groups[size]) for _ in range(BURSTS))
        out[f"{family}/{size}"] = [times[nbytes] for nbytes in SIZES]
    return out


def fit(seconds: dict) -> dict[str, AlphaBeta]:
    """{"family/group size": alpha + beta x bytes}, from ``collective_seconds``."""
    return {kind: fit_alpha_beta(SIZES, times) for kind, times in seconds.items()}


def layer_seconds(rows: int, fan_in: int, fan_out: int, repeats: int = 20) -> float:
    """One Linear + ReLU, forward and backward, at this shape: the median of ``repeats``."""
    layer = nn.Sequential(nn.Linear(fan_in, fan_out), nn.ReLU())
    x = torch.randn(rows, fan_in, requires_grad=True)
    times = []
    for _ in range(repeats + 1):
        start = time.perf_counter()
        layer(x).sum().backward()
        times.append(time.perf_counter() - start)
    return sorted(times[1:])[repeats // 2]


def adam_seconds_per_parameter(numel: int = 1 << 18, repeats: int = 10) -> float:
    p = nn.Parameter(torch.randn(numel))
    p.grad = torch.randn(numel)
    optimizer = torch.optim.Adam([p])
    optimizer.step()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        optimizer.step()
        times.append(time.perf_counter() - start)
    return sorted(times)[repeats // 2] / numel


def pipeline_slot_seconds(config, repeats: int = 5) -> float:
    """One micro-batch through the 4 stages of the PP plan, forward and back (GPipe with one
    micro-batch: p slots one after the other, one stage busy at a time), per slot: a stage's
    compute, its hop to the neighbour, and what neither calibration above sees, the wait for
    a process to wake up and the Python of each step. The fastest of ``repeats`` passes, the
    slowest rank's."""
    from ddp_lab.course.ch14_planning.plans import global_batch, pipeline_stage
    from ddp_lab.course.timing import slowest_rank_seconds
    rows = config.global_batch // config.microbatches
    stage = pipeline_stage(config, rows)
    x, y = (t[:rows] for t in global_batch(config, 0))

    def one_pass() -> None:
        stage.run("GPipe", [x], [y], nn.functional.mse_loss)
        stage.module.zero_grad()
    times = [slowest_rank_seconds(one_pass) for _ in range(repeats + 1)]
    return min(times[1:]) / dist.get_world_size()


def busy_slot_seconds(config, repeats: int = 5) -> float:
    """One slot of the pipeline with every stage busy at once, as in the middle of GPipe's
    schedule: each stage runs its layers forward on a micro-batch, sends the output to the
    next stage and receives one from the previous (a ring, so that every stage has both
    neighbours), then backward, sending the input's gradient back the other way. The 4
    processes now share the cores and wake each other up while the others compute. The
    fastest of ``repeats``, the slowest rank's."""
    from ddp_lab.course.ch14_planning.plans import pipeline_stage
    from ddp_lab.course.timing import slowest_rank_seconds
    rank, stages = dist.get_rank(), dist.get_world_size()
    rows = config.global_batch // config.microbatches
    stage = pipeline_stage(config, rows)
    x = torch.randn(rows, config.width, requires_grad=True)
    grad = torch.randn(rows, config.width)
    received = torch.empty(rows, config.width)

    def slot() -> None:
        out = stage.module(x)
        send = dist.isend(out.detach().contiguous(), (rank + 1) % stages)
        dist.recv(received, (rank - 1) % stages)
        send.wait()
        out.backward(grad)
        send = dist.isend(x.grad.contiguous(), (rank - 1) % stages)
        dist.recv(received, (rank + 1) % stages)
        send.wait()
        x.grad = None
        stage.module.zero_grad()
    times = [slowest_rank_seconds(slot) for _ in range(repeats + 1)]
    return min(times[1:])


def compute_seconds(shapes, config) -> dict:
    """{"rows x fan_in x fan_out": seconds of forward + backward} for each shape, "adam":
    seconds of Adam's step per parameter, "pipeline_slot": ``pipeline_slot_seconds`` (one
    stage busy), "pipeline_slot_busy": ``busy_slot_seconds`` (every stage busy)."""
    out = {f"{r}x{i}x{o}": layer_seconds(r, i, o) for r, i, o in shapes}
    out["adam"] = adam_seconds_per_parameter()
    out["pipeline_slot"] = pipeline_slot_seconds(config)
    out["pipeline_slot_busy"] = busy_slot_seconds(config)
    return out
