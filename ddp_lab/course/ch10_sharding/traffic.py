"""The bytes each sharding stage communicates per training step (notebook 10), counted by
tracing every collective of one step (``course.collective_trace``) once the one-off work
(DDP's constructor broadcast and bucket rebuild, optimizer state creation) is over.

The textbook accounting (the ZeRO paper's communication analysis) for P bytes of fp32
parameters on n ranks, per rank and step, with ring collectives: DDP all-reduces the
gradients, 2 (n-1)/n P. ZeRO-1 and ZeRO-2 reduce-scatter the gradients and all-gather the
updated parameters: the same 2 (n-1)/n P. ZeRO-3 all-gathers the parameters again in
backward: 3 (n-1)/n P, 1.5x DDP.
"""

from __future__ import annotations

import time

import torch
import torch.distributed as dist

from ddp_lab.course.ch10_sharding.equivalence import (VARIANTS, TrainConfig, fsdp2_torch,
                                                     fsdp_scratch, global_batch, make_model,
                                                     my_rows, train, train_step)
from ddp_lab.course.collective_trace import CollectiveTrace

TRAFFIC_MODEL = TrainConfig(inputs=64, width=128, outputs=64, global_batch=8, steps=2)


def parameter_bytes(config: TrainConfig) -> int:
    return sum(p.numel() * p.element_size() for p in make_model(config).parameters())


def traced_step(setup, config: TrainConfig) -> CollectiveTrace:
    """Every collective of the third training step of ``setup``: the first two include
    one-off work (optimizer state creation, DDP's bucket rebuild at the second iteration)."""
    for step in range(2):
        train_step(setup, config, step)
    with CollectiveTrace(dist.get_world_size()) as trace:
        train_step(setup, config, 2)
    return trace


def summary(trace: CollectiveTrace) -> dict:
    return {"counts": trace.counts(), "bytes": trace.total_bytes(),
            "bytes_per_rank": trace.bytes_per_rank(),
            "calls": [(c.name, c.nbytes, c.bytes_per_rank) for c in trace.calls]}


def traffic_per_step(names=tuple(VARIANTS), config: TrainConfig = TRAFFIC_MODEL) -> dict:
    """On each rank: {variant: what one step's collectives moved}, and the parameters' bytes."""
    return {"world_size": dist.get_world_size(), "parameter_bytes": parameter_bytes(config),
            "variants": {name: summary(traced_step(VARIANTS[name](config), config))
                         for name in names}}


def reshard_trade_off(config: TrainConfig = TRAFFIC_MODEL, steps: int = 5) -> dict:
    """FSDP2 with ``reshard_after_forward`` True and False: all-gathers per step, bytes of
    full (unsharded) parameters kept between forward and backward, and seconds per step."""
    results = {}
    for reshard in (True, False):
        setup = fsdp2_torch(config, reshard_after_forward=reshard)
        trace = traced_step(setup, config)
        setup.model(first_rows(config))  # a forward only: what stays unsharded until backward?
        kept = sum(p.numel() * p.element_size() for p in setup.model.parameters()
                   if not hasattr(p, "to_local"))
        setup.model.reshard()  # this forward had no backward: free what it gathered
        results[reshard] = {**summary(trace), "kept_after_forward": kept,
                            "seconds": _seconds_per_step(setup, config, steps)}
    return results


def first_rows(config: TrainConfig):
    return my_rows(global_batch(config, 0)[0])


def compute_dtype_trade_off(config: TrainConfig = TRAFFIC_MODEL) -> dict:
    """The scratch FSDP with fp32 and with bfloat16 compute: one step's collectives, and
    how far ``config.steps`` steps of training land from the fp32 one-process reference."""
    results = {}
    for dtype in (torch.float32, torch.bfloat16):
        trace = traced_step(fsdp_scratch(config, compute_dtype=dtype), config)
        trained = train(fsdp_scratch(config, compute_dtype=dtype), config)
        results[str(dtype).replace("torch.", "")] = {**summary(trace), **trained}
    return results


def _seconds_per_step(setup, config: TrainConfig, steps: int) -> float:
    dist.barrier()
    start = time.perf_counter()
    for step in range(steps):
        train_step(setup, config, step)
    dist.barrier()
    return (time.perf_counter() - start) / steps
