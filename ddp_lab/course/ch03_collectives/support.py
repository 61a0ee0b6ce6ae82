"""What a backend has, really tried: every ReduceOp on float32 and int64, which collectives
the tour could run (with NCCL's and older gloo's support from the docs and PRs), and the
collectives a backend lacks, built from the ones it has."""

from __future__ import annotations

import torch
import torch.distributed as dist

from ddp_lab.course.ch03_collectives.collectives import (
    all_to_all, rank_and_world, rank_values, reduce_op, reduce_scatter)
from ddp_lab.launch.errors import short_message

REDUCE_OPS = ("SUM", "PRODUCT", "MIN", "MAX", "AVG", "BAND", "BOR", "BXOR", "PREMUL_SUM")
# From the torch.distributed.ReduceOp docs (not tried here: that needs GPUs).
NCCL_REDUCE_OPS = {"SUM": "yes", "PRODUCT": "yes", "MIN": "yes", "MAX": "yes",
                   "AVG": "yes (NCCL >= 2.10)", "BAND": "no", "BOR": "no", "BXOR": "no",
                   "PREMUL_SUM": "yes (NCCL >= 2.11)"}


def try_reduce_ops(numel: int = 3) -> dict:
    """all_reduce with every ReduceOp on float32 and int64: the result, or the error raised
    (raised on every rank alike, so one failure does not desynchronize the next op)."""
    table = {}
    for op in REDUCE_OPS:
        for dtype in ("float32", "int64"):
            t = rank_values(dist.get_rank(), numel, dtype)
            try:
                dist.all_reduce(t, op=reduce_op(op))
                table[op, dtype] = t.tolist()
            except (RuntimeError, TypeError, ValueError) as exc:
                table[op, dtype] = f"{type(exc).__name__}: {short_message(str(exc), 70)}"
    return table


def reduce_op_markdown(table: dict) -> str:
    rows = [f"| `{op}` | {table[op, 'float32']} | {table[op, 'int64']} | {NCCL_REDUCE_OPS[op]} |"
            for op in REDUCE_OPS]
    head = ["| ReduceOp | gloo, float32 (tried) | gloo, int64 (tried) | NCCL (docs) |",
            "|---|---|---|---|"]
    return "\n".join(head + rows)


# --- which collectives the backend has: the tour tried them -----------------------------------

# NCCL from the torch.distributed docs' backend table; gloo's past from the PRs that added them.
NCCL_COLLECTIVES = {
    "gather": "yes since torch 1.11, built on send/recv (before: `ProcessGroupNCCL does not "
              "support gather`, the error older DDP notes report)",
    "scatter": "yes since torch 1.11, built on send/recv",
    "all_to_all": "yes, parts may differ in size"}
GLOO_HISTORY = {
    "reduce_scatter": "before pytorch#149869 (2025): `ProcessGroupGloo does not support "
                      "reduce_scatter`",
    "reduce_scatter_single": "emulated as all_reduce + chunk (pytorch#118911)",
    "all_to_all": "before pytorch#165435 (2026): `ProcessGroup gloo does not support alltoall`;"
                  " parts must be equal in size"}


def support_markdown(tour_result: dict) -> str:
    rows = [f"| `{name}` | {'error: ' + r['error'] if 'error' in r else 'yes'} | "
            f"{GLOO_HISTORY.get(name, '')} | {NCCL_COLLECTIVES.get(name, 'yes')} |"
            for name, r in tour_result.items()]
    head = ["| collective | gloo here (tried) | gloo in older torch | NCCL (docs) |",
            "|---|---|---|---|"]
    return "\n".join(head + rows)


def all_to_all_unequal(numel: int = 7) -> dict:
    """all_to_all with parts of different sizes (7 values in 4 parts): NCCL accepts them."""
    rank, world = rank_and_world()
    parts = list(torch.tensor_split(rank_values(rank, numel), world))
    out = [torch.zeros_like(parts[rank]) for _ in range(world)]
    dist.all_to_all(out, parts)
    return {"before": parts, "after": out}


def reduce_scatter_via_all_reduce(numel: int = 7) -> dict:
    """reduce_scatter for a backend without it: all_reduce everything, keep your own part.
    Twice the traffic of a real one (all_reduce = reduce_scatter + all_gather)."""
    rank, world = rank_and_world()
    t = rank_values(rank, numel)
    dist.all_reduce(t)
    return {"equivalent": torch.tensor_split(t, world)[rank],
            "builtin": reduce_scatter(numel)["after"]}


def all_to_all_via_scatter(numel: int = 2) -> dict:
    """all_to_all for a backend without it: every rank takes one turn as scatter's source."""
    rank, world = rank_and_world()
    parts = list(rank_values(rank, numel * world).chunk(world))
    out = [torch.zeros_like(parts[0]) for _ in range(world)]
    for src in range(world):
        dist.scatter(out[src], parts if rank == src else None, src=src)
    return {"equivalent": out, "builtin": all_to_all(numel)["after"]}


def reduce_scatter_underneath(numel: int = 1024) -> dict:
    """What gloo really runs for each reduce-scatter call: the ``gloo:*`` spans that
    ``torch.profiler`` records on the process group's worker threads. In torch 2.13 gloo
    has no reduce-scatter algorithm of its own: ``reduce_scatter_single`` is one all-reduce
    of the whole input, ``reduce_scatter`` one all-reduce per chunk, so either moves an
    all-reduce's bytes, twice a ring reduce-scatter's."""
    from torch.profiler import ProfilerActivity, profile

    from ddp_lab.course.trace_events import spans_of
    world = dist.get_world_size()
    full, out = torch.ones(world * numel), torch.empty(numel)
    calls = {"reduce_scatter_single": lambda: dist.reduce_scatter_single(out, full),
             "reduce_scatter": lambda: dist.reduce_scatter(out, list(full.chunk(world)))}
    underneath = {}
    for name, call in calls.items():
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            call()
        underneath[name] = [s.name for s in spans_of(prof) if s.name.startswith("gloo:")]
    return underneath


def float_sums(numel: int = 10_000) -> dict:
    """This rank's float32 values (mixed magnitudes) and their all-reduce SUM, to compare in
    the kernel with sums in other orders: float addition is commutative but not
    associative, so the order of the additions changes the last bits."""
    generator = torch.Generator().manual_seed(dist.get_rank())
    mine = torch.randn(numel, generator=generator) * 10.0 ** torch.randint(
        -3, 4, (numel,), generator=generator)
    summed = mine.clone()
    dist.all_reduce(summed)
    return {"mine": mine, "all_reduce": summed}


def sums_in_orders(per_rank: list[dict]) -> dict:
    """Left to right over ranks 0..N-1, right to left, and pairwise ((0+1)+(2+3)...), each
    in float32, next to the all-reduce's result."""
    values = [r["mine"] for r in per_rank]
    pairs = values
    while len(pairs) > 1:
        pairs = [pairs[k] + pairs[k + 1] if k + 1 < len(pairs) else pairs[k]
                 for k in range(0, len(pairs), 2)]
    forward, backward = values[0].clone(), values[-1].clone()
    for v in values[1:]:
        forward += v
    for v in values[-2::-1]:
        backward += v
    return {"ranks 0..N-1": forward, "ranks N-1..0": backward, "pairwise": pairs[0],
            "all_reduce": per_rank[0]["all_reduce"]}


def rounding_bound(per_rank: list[dict]) -> torch.Tensor:
    """Per element, how far two float32 sums of the same N values in different orders may
    lie apart: each of the N-1 additions rounds by at most half an ulp of a partial sum,
    itself at most the sum of the magnitudes, so N * eps * sum(|x|) bounds them both."""
    magnitudes = torch.stack([r["mine"].abs() for r in per_rank]).sum(0)
    return len(per_rank) * torch.finfo(torch.float32).eps * magnitudes
