"""Step time predicted from the cost model: compute (per-layer forward + backward and Adam's
step, measured on this machine by ``calibrate``) plus every collective of the step at its
alpha + beta x bytes (fitted on the shaped link), one after the other: on gloo the caller
waits for each collective, so nothing is assumed to overlap.

The pipeline is the exception: its sends overlap other stages' work, and what costs is the
schedule. GPipe on p stages with m micro-batches runs m + p - 1 slots forward and as many
backward; a slot is one stage's compute on one micro-batch plus one transfer to its
neighbour (Huang et al., https://arxiv.org/abs/1811.06965).
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
    """Every collective's alpha + beta x bytes, one after the other (a recv is the other end
    of a send, counted once)."""
    return sum(fits[f"{family}/{size}"].predict(nbytes)
               for family, nbytes, size in predicted_calls(name, config, rank)
               if family != "recv")


def pipeline_seconds(config: PlanConfig, fits: dict, compute: dict) -> float:
    m, p = config.microbatches, WORLD
    stage = sum(compute[_key(s)] for s in layer_shapes("PP", config))
    transfer = fits["send/4"].predict(config.global_batch // m * config.width * 4)
    adam = compute["adam"] * adam_parameters("PP", config, 0)
    return (m + p - 1) * (stage + 2 * transfer) + adam


def predicted_seconds(name: str, config: PlanConfig, fits: dict, compute: dict) -> dict:
    """{"compute", "comm", "total"} seconds of one step of ``name`` (the slowest rank's:
    ranks of a plan do the same work, but for the pipeline's ends)."""
    if name == "PP":
        slots = config.microbatches + WORLD - 1
        stage = sum(compute[_key(s)] for s in layer_shapes("PP", config))
        comm = pipeline_seconds(config, fits, compute) - slots * stage \
            - compute["adam"] * adam_parameters("PP", config, 0)
        total = pipeline_seconds(config, fits, compute)
        return {"compute": total - comm, "comm": comm, "total": total}
    compute_s = max(compute_seconds(name, config, compute, r) for r in range(WORLD))
    comm = comm_seconds(name, config, fits)
    return {"compute": compute_s, "comm": comm, "total": compute_s + comm}
