"""FSDP2 on a slow link (notebook 10): where its all-gathers cost time, and what
prefetching and ``reshard_after_forward=False`` do about it.

ZeRO-3 all-gathers every layer's weights before its forward and again before its backward.
On loopback that costs a millisecond; on a link of a few hundred Mbit/s it costs more than
the computation. Three settings of torch's ``fully_shard``, one layer per FSDP
module, take turns step by step in the same run (``course.timing``):

- "blocking": FSDP2's defaults. On CPU they hide nothing: FSDP2 issues its pre-forward and
  pre-backward all-gathers with ``async_op=False`` (``FSDPParamGroup.unshard_async_op``),
  which on GPUs still overlaps because the NCCL kernel runs on its own stream while the
  CPU goes on, but with gloo the caller waits for the data (``all_gather_single`` in
  torch/distributed/distributed_c10d.py calls ``work.wait()``). Its default backward prefetch
  (``_backward_prefetch``) only moves the blocking call one layer earlier.
- "prefetch": each layer prefetches the next one in forward
  (``set_modules_to_forward_prefetch``) and the previous one in backward
  (``set_modules_to_backward_prefetch``), with ``async_op=True`` so that gloo moves the
  bytes on its own thread while this one computes. Combined with those two setters, torch
  2.13 reaches that only through the private ``_set_unshard_async_op(True)`` (its
  docstring: "you must use explicit prefetching ... in forward to still get overlap"):
  torch/distributed/fsdp/_fully_shard/_fully_shard.py. The public way is to call
  ``next_layer.unshard(async_op=True)`` yourself, e.g. from a forward pre-hook; FSDP waits
  for the returned handle in that layer's pre-forward. The bytes are the same; only when
  they move changes.
- "keep weights": ``reshard_after_forward=False``: no all-gathers in backward at all, for
  the memory of the full weights between forward and backward.

The reduce-scatters of the gradients stay blocking in all three (gloo on CPU).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch.distributed as dist

from ddp_lab.course.ch10_sharding.equivalence import TrainConfig, fsdp2_torch, train_step
from ddp_lab.course.ch10_sharding.traffic import parameter_bytes
from ddp_lab.course.collective_trace import CollectiveTrace
from ddp_lab.course.timing import time_in_turns

# 4 layers of 384 x 384: 2.4 MB of fp32 weights, 0.6 MB per layer (above the link's
# 256 KiB burst, so the rate shows), no padding on 2 or 4 ranks.
SLOW_LINK_MODEL = TrainConfig(inputs=384, width=384, outputs=384, hidden_layers=2,
                              global_batch=128, steps=1)
SETTINGS = ("blocking", "prefetch", "keep weights")


@dataclass(frozen=True)
class SlowLinkConfig:
    """What ``step_times`` trains and how long it times: after the traced step,
    ``warmup`` untimed rounds, then ``iterations`` timed rounds of every setting."""

    model: TrainConfig = SLOW_LINK_MODEL
    warmup: int = 0
    iterations: int = 3

    def __post_init__(self):
        if not isinstance(self.model, TrainConfig):
            raise TypeError(f"model must be an equivalence.TrainConfig, not {self.model!r}")
        if self.warmup < 0 or self.iterations < 1:
            raise ValueError(f"warmup={self.warmup}, iterations={self.iterations}: use "
                             "warmup >= 0 and at least one timed iteration")


def fsdp2_setting(name: str, config: TrainConfig):
    """A ``Setup`` (equivalence.py) of FSDP2 for one of SETTINGS."""
    if name not in SETTINGS:
        raise ValueError(f"setting {name!r} is not one of {SETTINGS}")
    setup = fsdp2_torch(config, reshard_after_forward=name != "keep weights")
    if name == "prefetch":
        prefetch_neighbours(setup.model)
    return setup


def prefetch_neighbours(model) -> None:
    """Each FSDP layer starts the next layer's all-gather in forward and the previous
    layer's in backward, without waiting for it (async_op=True)."""
    from torch.distributed.fsdp import FSDPModule
    layers = [m for m in model if isinstance(m, FSDPModule)]
    for earlier, later in zip(layers, layers[1:]):
        earlier.set_modules_to_forward_prefetch([later])
        later.set_modules_to_backward_prefetch([earlier])
    model._set_unshard_async_op(True)  # private in torch 2.13; see the module docstring


def all_gathered_bytes(trace) -> int:
    """Bytes of full (unsharded) tensors all-gathered in one traced step."""
    return sum(call.nbytes for call in trace.calls if "allgather" in call.name)


def traced(setup, config: TrainConfig):
    """Every collective of the second step (the first one initialises FSDP2 lazily and
    creates Adam's state)."""
    train_step(setup, config, 0)
    with CollectiveTrace(dist.get_world_size()) as trace:
        train_step(setup, config, 1)
    return trace


def step_times(config: SlowLinkConfig = SlowLinkConfig()) -> dict:
    """On each rank: {"ms": {setting: the fastest timed step, the slowest rank's ms},
    "all_gathered": {setting: bytes all-gathered per step}, "counts": {setting:
    collectives per step}, "parameter_bytes", "world_size"}. The fastest step, not the
    median: load from elsewhere only ever adds time, a slow link sets a floor."""
    setups = {name: fsdp2_setting(name, config.model) for name in SETTINGS}
    traces = {name: traced(setup, config.model) for name, setup in setups.items()}
    batches = iter(range(2, 10**9))  # every timed step trains on a new global batch
    steps = {name: (lambda s=setup: train_step(s, config.model, next(batches)))
             for name, setup in setups.items()}
    times = time_in_turns(steps, config.warmup, config.iterations)
    return {"ms": {name: min(t) * 1e3 for name, t in times.items()},
            "all_gathered": {name: all_gathered_bytes(t) for name, t in traces.items()},
            "counts": {name: t.counts() for name, t in traces.items()},
            "parameter_bytes": parameter_bytes(config.model),
            "world_size": dist.get_world_size()}


def compare(bandwidth: str = "200mbit", config: SlowLinkConfig = SlowLinkConfig(),
            timeout: float = 120.0) -> dict:
    """The same settings on loopback and on links of ``bandwidth``, 2 ranks:
    {"loopback": [per-rank results], bandwidth: [per-rank results]}."""
    import ddp_lab
    from ddp_lab.launch.network.setting import parse_bandwidth
    parse_bandwidth(bandwidth)  # a bad rate fails here, not after the loopback run
    return {network or "loopback": ddp_lab.run(step_times, world_size=2, args=(config,),
                                               network=network, timeout=timeout,
                                               echo=False).values
            for network in (None, bandwidth)}


def wire_ms(result: dict, bandwidth: str) -> float:
    """Milliseconds the all-gathers of the "blocking" setting need on links of
    ``bandwidth``: each rank receives (n-1)/n of every full tensor."""
    from ddp_lab.launch.network.setting import parse_bandwidth
    n = result["world_size"]
    received = result["all_gathered"]["blocking"] * (n - 1) / n
    return received * 8 / parse_bandwidth(bandwidth) * 1e3


def format_table(results: dict) -> str:
    """Milliseconds per step of each setting on each network (rank 0's copy)."""
    names = list(results)
    lines = [f"{'setting':>14} " + " ".join(f"{n + ' ms':>14}" for n in names)
             + f" {'all-gathered':>14}"]
    for s in SETTINGS:
        first = results[names[0]][0]
        lines.append(f"{s:>14} " + " ".join(f"{results[n][0]['ms'][s]:>14.1f}" for n in names)
                     + f" {first['all_gathered'][s] / first['parameter_bytes']:>12.1f} P")
    return "\n".join(lines)

