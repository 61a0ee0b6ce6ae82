"""Step time predicted from the cost model: compute (per-layer forward + backward and Adam's
step, measured on this machine by ``calibrate``) plus every collective of the step at its
alpha + beta x bytes (fitted on the shaped link), one after the other: on gloo the caller
waits for each collective, so nothing is assumed to overlap.

The pipeline is the exception: what costs is the schedule. GPipe on p stages with m
micro-batches runs m + p - 1 slots (Huang et al., https://arxiv.org/abs/1811.06965), a slot
being one micro-batch's forward and backward on a stage with its hops to the neighbours.
On this machine a slot is mostly fixed cost (a process waking up when its neighbour's
message arrives, the Python of each step: a few 16 KiB messages ride the link's burst), and
it grows with the number of stages busy at once: the 4 processes share 2 cores, and each
wake-up waits for a core. So the slot is calibrated at both ends: with one stage busy (a
pass of one micro-batch, ``calibrate.pipeline_slot_seconds``) and with every stage busy
(``calibrate.busy_slot_seconds``); a slot of GPipe's schedule with b of the p stages busy is
taken on the straight line between the two. (Calibrated on the one-stage pass alone, the
model predicted half the measured step.)
"""

from __future__ import annotations

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


def busy_stages(slot: int, config: PlanConfig) -> int:
    """Stages that hold a micro-batch in GPipe's ``slot`` (0 .. m + p - 2): 1, 2, .., then
    down again as the pipeline drains."""
    m, p = config.microbatches, WORLD
    return min(slot + 1, m, p, m + p - 1 - slot)


def slot_seconds(busy: int, compute: dict) -> float:
    """A slot with ``busy`` of the WORLD stages busy: on the line from the calibrated slot
    with one stage busy to the one with every stage busy."""
    one, every = compute["pipeline_slot"], compute["pipeline_slot_busy"]
    return one + (every - one) * (busy - 1) / (WORLD - 1)


def pipeline_seconds(config: PlanConfig, compute: dict) -> float:
    """GPipe: m + p - 1 slots, each as long as a calibrated slot with as many stages busy,
    then Adam."""
    slots = range(config.microbatches + WORLD - 1)
    return (sum(slot_seconds(busy_stages(s, config), compute) for s in slots)
            + compute["adam"] * adam_parameters("PP", config, 0))


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
