"""The cost model on paper at cluster scale (notebook 14): the same MLP stack, grown, on 64
GPUs in 8 nodes, with published figures instead of measured ones.

Hardware (DGX H100: https://docs.nvidia.com/dgx/dgxh100-user-guide/introduction-to-dgxh100.html;
H100 SXM: https://www.nvidia.com/en-us/data-center/h100/):
- 989 TFLOPS of dense BF16 per GPU (the datasheet's 1,979 is "with sparsity"; dense is half);
  used as if reached, so compute is a lower bound and communication looks its worst;
- 80 GB of HBM3 per GPU;
- NVLink 4: 900 GB/s per GPU in both directions together, 450 GB/s each way, inside a node;
- InfiniBand NDR: one 400 Gb/s ConnectX-7 per GPU, 50 GB/s each way, between nodes.

Memory: mixed-precision Adam keeps 16 bytes per parameter (bf16 weights 2 and gradients 2,
fp32 master weights, momentum and variance 12: ZeRO, https://arxiv.org/abs/1910.02054, 3.1;
ZeRO-1 shards the 12, ZeRO-2 the gradients' 2 too, ZeRO-3 (FSDP) everything),
and each layer's output (bf16, rows x width) until backward; with activation checkpointing
only each pair of layers' input is kept, one pair's outputs are rebuilt at a time, and the
forward runs twice (8 instead of 6 flops per parameter and row).

Time: compute at peak plus every collective at the ring's bytes over the slowest link it
crosses, one after the other (no overlap: the same rule as the measured model). Latency is
left out: every message here is megabytes.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

TFLOPS = 989e12
HBM = 80e9
NVLINK = 450e9   # bytes/s each way per GPU
IB = 50e9        # bytes/s each way per GPU
GPUS_PER_NODE, NODES = 8, 8
BF16 = 2
STATE_BYTES = 16  # per parameter, mixed-precision Adam
SCALE_PLANS = ("DDP", "ZeRO-1", "ZeRO-2", "FSDP", "TP64", "TP8xFSDP8", "PP8xDP8")


@dataclass(frozen=True)
class Job:
    """An MLP of ``layers`` width x width layers trained on ``tokens`` rows per step;
    the pipeline cuts each replica's rows into ``microbatches``."""

    width: int = 8192
    layers: int = 32
    tokens: int = 1 << 19
    microbatches: int = 32

    @property
    def params(self) -> float:
        return self.layers * self.width ** 2


def ring(nbytes: float, n: int, link: float, factor: float = 1.0) -> float:
    """Seconds of a ring collective over n GPUs: factor x (n-1)/n x nbytes over the link
    (factor 2 for an all-reduce, 1 for an all-gather or a reduce-scatter)."""
    return factor * (n - 1) / n * nbytes / link if n > 1 else 0.0


def _activations(job: Job, rows: float, layers: float, tp: int, checkpointed: bool) -> float:
    """Bytes of layer outputs kept for backward: per layer rows x width (a tensor-parallel
    pair keeps its column half split: (1 + 1/tp) x rows x width per pair)."""
    per_pair = rows * job.width * (1 + 1 / tp) * BF16
    if checkpointed:
        return layers / 2 * rows * job.width * BF16 + per_pair
    return layers / 2 * per_pair


def _plan(job: Job, name: str) -> dict:
    """{"state", "activations", "activations_checkpointed", "comm", "flops_per_gpu",
    "bubble"} of one plan; comm in seconds, at 6 flops per parameter and row."""
    n, p, t = NODES * GPUS_PER_NODE, job.params, GPUS_PER_NODE
    grads = BF16 * p
    if name in ("DDP", "ZeRO-1", "ZeRO-2", "FSDP"):
        rows, held = job.tokens / n, {"DDP": STATE_BYTES * p, "ZeRO-1": 4 * p + 12 * p / n,
                                      "ZeRO-2": 2 * p + 14 * p / n,
                                      "FSDP": STATE_BYTES * p / n}[name]
        comm = ring(grads, n, IB, 3.0 if name == "FSDP" else 2.0)
        shape = (rows, job.layers, 1)
    elif name == "TP64":
        rows, held = job.tokens, STATE_BYTES * p / n
        comm = job.layers * ring(rows * job.width * BF16, n, IB, 2.0)
        shape = (rows, job.layers, n)
    elif name == "TP8xFSDP8":
        rows, held = job.tokens / NODES, STATE_BYTES * p / n
        comm = job.layers * ring(rows * job.width * BF16, t, NVLINK, 2.0) \
            + ring(grads / t, NODES, IB, 3.0)
        shape = (rows, job.layers, t)
    else:  # PP8xDP8: stages across nodes, data parallel inside a node
        rows, held = job.tokens / t, STATE_BYTES * p / NODES
        micro = rows / job.microbatches
        slots = job.microbatches + NODES - 1
        comm = 2 * slots * micro * job.width * BF16 / IB + ring(grads / NODES, t, NVLINK, 2.0)
        shape = (rows, job.layers / NODES, 1)
    bubble = (job.microbatches + NODES - 1) / job.microbatches if name == "PP8xDP8" else 1.0
    rows_, layers_, tp = shape
    return {"state": held, "activations": _activations(job, rows_, layers_, tp, False),
            "activations_checkpointed": _activations(job, rows_, layers_, tp, True),
            "comm": comm, "compute": 6 * p * job.tokens / n / TFLOPS * bubble}


def plan_at_scale(job: Job, name: str) -> dict:
    """One plan: bytes per GPU, whether it fits in 80 GB (with checkpointing if it must),
    and its step time: {"memory", "fits", "checkpointed", "compute", "comm", "seconds"}."""
    c = _plan(job, name)
    checkpointed = c["state"] + c["activations"] > HBM
    memory = c["state"] + c["activations" + ("_checkpointed" if checkpointed else "")]
    compute = c["compute"] * (8 / 6 if checkpointed else 1.0)
    comm = c["comm"] * (1.5 if checkpointed and name.startswith("TP") else 1.0)
    return {"memory": memory, "fits": memory <= HBM, "checkpointed": checkpointed,
            "compute": compute, "comm": comm, "seconds": compute + comm}


def every_plan(job: Job) -> dict:
    return {name: plan_at_scale(job, name) for name in SCALE_PLANS}


def best(plans: dict) -> str:
    """The fastest plan that fits, of ``every_plan``'s results ("none" if none fits)."""
    fitting = {n: r for n, r in plans.items() if r["fits"]}
    return min(fitting, key=lambda n: fitting[n]["seconds"]) if fitting else "none"


def sweep(widths=tuple(range(1024, 32769, 1024)), job: Job = Job()) -> dict:
    """{width: every_plan} for the same job at each width."""
    return {w: every_plan(replace(job, width=w)) for w in widths}


def winners(swept: dict) -> dict:
    """{width: the best plan}."""
    return {w: best(plans) for w, plans in swept.items()}


def crossovers(swept: dict) -> list[tuple[int, str, str]]:
    """(first width, plan before, plan after) wherever the best plan changes."""
    found, previous = [], None
    for width, name in winners(swept).items():
        if previous is not None and name != previous:
            found.append((width, previous, name))
        previous = name
    return found
