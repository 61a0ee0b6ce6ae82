"""Step time predicted from the cost model: compute (per-layer forward + backward and Adam's
step, measured on this machine by ``calibrate``) plus every collective of the step at its
alpha + beta x bytes (fitted on the shaped link), one after the other: on gloo the caller
waits for each collective, so nothing is assumed to overlap.

The pipeline is the exception: what costs is the schedule. GPipe on p stages with m
micro-batches runs m + p - 1 slots (Huang et al., https://arxiv.org/abs/1811.06965), a slot
being one micro-batch's forward and backward on a stage with its hops to the neighbours.
On this machine a slot is mostly fixed cost (a process waking up when its neighbour's
message arrives, the Python of each step: a few 16 KiB messages ride the link's burst), so
the slot is calibrated on a pass of one micro-batch (``calibrate.pipeline_slot_seconds``)
and the model predicts the step with m micro-batches from it, each slot stretched where more
stages are busy than the machine has cores.
"""

from __future__ import annotations

import os

from ddp_lab.course.ch14_planning.costs import WORLD, adam_parameters, predicted_calls
from ddp_lab.course.ch14_planning.plans import PlanConfig


def layer_shapes(name: str, config: PlanConfig) -> list[tuple[int, int, int]]:
    """(rows, fan_in, fan_out) of every Linear this rank computes in one step (PP: per
    micro-batch)."""
    w, g, pairs = config.width, config.global_batch, config.layers // 2
    if name in ("DDP", "ZeRO-1", "FSDP"):
        return [(g // WORLD, w, w)] * config.layers
    if name == "TP":
        return [(g, w, w // WORLD), (g, w // WORLD, w)] * pairs
    if name == "DP2xTP2":
        return [(g // 2, w, w // 2), (g // 2, w // 2, w)] * pairs
    return [(g // config.microbatches, w, w)] * (config.layers // WORLD)


def all_shapes(config: PlanConfig, names) -> list:
    return sorted({s for name in names for s in layer_shapes(name, config)})


def _key(shape) -> str:
    return "x".join(map(str, shape))


def compute_seconds(name: str, config: PlanConfig, compute: dict, rank: int = 0) -> float:
    layers = sum(compute[_key(s)] for s in layer_shapes(name, config))
    return layers + compute["adam"] * adam_parameters(name, config, rank)


def comm_seconds(name: str, config: PlanConfig, fits: dict, rank: int = 0) -> float:
    """Every collective's alpha + beta x bytes, one after the other (not for the pipeline)."""
    return sum(fits[f"{family}/{size}"].predict(nbytes)
               for family, nbytes, size in predicted_calls(name, config, rank))


def machine_cores() -> int:
    return len(os.sched_getaffinity(0))


def busy_stages(slot: int, config: PlanConfig) -> int:
    """Stages that hold a micro-batch in GPipe's ``slot`` (0 .. m + p - 2): 1, 2, .., then
    down again as the pipeline drains."""
    m, p = config.microbatches, WORLD
    return min(slot + 1, m, p, m + p - 1 - slot)


def pipeline_seconds(config: PlanConfig, compute: dict, cores: int | None = None) -> float:
    """GPipe: m + p - 1 slots, each as long as the calibrated slot, longer where more stages
    are busy at once than there are cores (the calibration pass had one busy stage at a time),
    then Adam."""
    cores = cores or machine_cores()
    slots = range(config.microbatches + WORLD - 1)
    shared = sum(max(1.0, busy_stages(s, config) / cores) for s in slots)
    return shared * compute["pipeline_slot"] + compute["adam"] * adam_parameters("PP", config, 0)


def predicted_seconds(name: str, config: PlanConfig, fits: dict, compute: dict) -> dict:
    """{"compute", "comm", "total"} seconds of one step of ``name`` (the slowest rank's:
    ranks of a plan do the same work, but for the pipeline's ends)."""
    if name == "PP":
        slots = config.microbatches + WORLD - 1
        total = pipeline_seconds(config, compute)
        stage = sum(compute[_key(s)] for s in layer_shapes("PP", config))
        compute_s = slots * stage + compute["adam"] * adam_parameters("PP", config, 0)
        return {"compute": compute_s, "comm": total - compute_s, "total": total}
    compute_s = max(compute_seconds(name, config, compute, r) for r in range(WORLD))
    comm = comm_seconds(name, config, fits)
    return {"compute": compute_s, "comm": comm, "total": compute_s + comm}
