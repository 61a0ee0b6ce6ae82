"""The cost model of notebook 14, written before anything runs: for each plan on 4 ranks,
the collectives one training step issues on each rank (family, bytes of the full tensor,
group size), the bytes of state each rank holds, and the step time those imply with the
alpha-beta fits and the per-layer compute measured on this machine.

The call lists are exact, and the notebook asserts them against a trace of the real step.
They hold two details that the textbook accounting (DDP 2P, FSDP 3P) leaves out, both
because autograd computes only the gradients something needs: the first layer's input needs
no gradient, so (1) FSDP does not all-gather the first weight again in backward (a Linear
saves its weight only to compute its input's gradient) and (2) tensor parallelism skips the
first pair's backward all-reduce (Megatron's "f" is the input's gradient).
"""

from __future__ import annotations

from ddp_lab.course.ch14_planning.plans import PlanConfig
from ddp_lab.scratch.sharded_optimizer import partition

F32 = 4
WORLD = 4


def _pad(numel: int, n: int = WORLD) -> int:
    return numel + (-numel) % n


def param_numels(config: PlanConfig) -> list[int]:
    """Every parameter of the MLP in order: weight, bias, weight, bias, ..."""
    w = config.width
    return [w * w, w] * config.layers


def ddp_calls(config: PlanConfig, rank: int) -> list:
    numels = param_numels(config)
    # scratch.DDP's sync_gradients also all-reduces one int64 "used" flag per parameter
    return [("all_reduce", n * F32, WORLD) for n in numels] + [("all_reduce", 8 * len(numels), WORLD)]


def zero1_calls(config: PlanConfig, rank: int) -> list:
    return ddp_calls(config, rank) + [("broadcast", n * F32, WORLD) for n in param_numels(config)]


def fsdp_calls(config: PlanConfig, rank: int) -> list:
    """Forward: all-gather every parameter; backward: all-gather each weight again except
    the first layer's, reduce-scatter every gradient (padded to a multiple of 4)."""
    w = config.width
    gather_w, gather_b = ("all_gather", _pad(w * w) * F32, WORLD), ("all_gather", _pad(w) * F32, WORLD)
    scatter_w, scatter_b = (("reduce_scatter", _pad(w * w) * F32, WORLD),
                            ("reduce_scatter", _pad(w) * F32, WORLD))
    per_layer = [gather_w, gather_b, scatter_w, scatter_b]
    return per_layer * config.layers + [gather_w] * (config.layers - 1)


def _tensor_parallel_calls(config: PlanConfig, rows: int, size: int) -> list:
    pairs = config.layers // 2
    activation = ("all_reduce", rows * config.width * F32, size)
    return [activation] * (2 * pairs - 1)   # g in forward per pair, f in backward but the first


def tp_calls(config: PlanConfig, rank: int) -> list:
    return _tensor_parallel_calls(config, config.global_batch, WORLD)


def two_d_calls(config: PlanConfig, rank: int) -> list:
    w, pairs = config.width, config.layers // 2
    slices = [w * w // 2, w // 2, w * w // 2, w] * pairs  # column W, b; row W, full b
    return (_tensor_parallel_calls(config, config.global_batch // 2, 2)
            + [("all_reduce", n * F32, 2) for n in slices])


def pp_calls(config: PlanConfig, rank: int) -> list:
    """GPipe: each micro-batch's activation goes forward and its gradient backward across
    every stage boundary, as a send and a recv."""
    m = config.microbatches
    nbytes = config.global_batch // m * config.width * F32
    boundaries = (rank > 0) + (rank < WORLD - 1)
    return [("send", nbytes, WORLD), ("recv", nbytes, WORLD)] * (m * boundaries)


CALLS = {"DDP": ddp_calls, "ZeRO-1": zero1_calls, "FSDP": fsdp_calls, "TP": tp_calls,
         "PP": pp_calls, "DP2xTP2": two_d_calls}


def predicted_calls(name: str, config: PlanConfig, rank: int) -> list:
    """Sorted, to compare with ``measure.traced_calls``."""
    return sorted(CALLS[name](config, rank))


def _tp_params(config: PlanConfig, size: int) -> int:
    w = config.width
    return (w * w // size + w // size + w * w // size + w) * (config.layers // 2)


def held_parameters(name: str, config: PlanConfig, rank: int) -> int:
    """Parameters (elements) this rank holds between steps."""
    total = sum(param_numels(config))
    return {"DDP": total, "ZeRO-1": total,
            "FSDP": sum(_pad(n) for n in param_numels(config)) // WORLD,
            "TP": _tp_params(config, WORLD), "PP": total // WORLD,
            "DP2xTP2": _tp_params(config, 2)}[name]


def adam_parameters(name: str, config: PlanConfig, rank: int) -> int:
    """Parameters whose Adam state (exp_avg, exp_avg_sq) this rank keeps."""
    if name != "ZeRO-1":
        return held_parameters(name, config, rank)
    numels = param_numels(config)
    return sum(n for n, owner in zip(numels, partition(numels, WORLD)) if owner == rank)


def predicted_state(name: str, config: PlanConfig, rank: int) -> dict:
    """Bytes of fp32 parameters, gradients and Adam's two moments on this rank."""
    held = held_parameters(name, config, rank) * F32
    return {"parameters": held, "gradients": held,
            "optimizer": 2 * adam_parameters(name, config, rank) * F32}


def sent_bytes(name: str, config: PlanConfig, rank: int) -> float:
    """Bytes this rank sends in one step, in the trace's ring accounting
    (``CollectiveCall.bytes_per_rank``: (n-1)/n of the tensor, twice for an all-reduce, a
    send whole, a recv nothing)."""
    from ddp_lab.course.collective_trace import FAMILIES, CollectiveCall
    return sum(CollectiveCall(FAMILIES[family][0], nbytes, size).bytes_per_rank
               for family, nbytes, size in predicted_calls(name, config, rank))
