"""Notebook 03: every collective, run on real ranks, checked against its math.

Rank r always starts from ``rank_values(r, numel)`` = 1, 2, 3, ... plus 10*r, so values are
distinct across ranks (the pictures colour a value by the rank it came from). Each collective
worker returns ``{"before": ..., "after": ...}``: what this rank held before and after the
call. ``expected`` computes the afters from the befores in one process, from the math alone.
What they cost, and the ways they go wrong, are in ``collective_costs``.
"""

from __future__ import annotations

import functools
import os

import torch
import torch.distributed as dist

from ddp_lab.launch.errors import short_message

ROOT = 0  # src/dst of the rooted collectives (broadcast, reduce, gather, scatter)


def rank_values(rank: int, numel: int, dtype: str = "int64") -> torch.Tensor:
    return torch.arange(1, numel + 1, dtype=getattr(torch, dtype)) + 10 * rank


def _me() -> tuple[int, int]:
    return dist.get_rank(), dist.get_world_size()


def reduce_op(name: str):
    # PREMUL_SUM is a factory (docs: ``ReduceOp.PREMUL_SUM(factor)``), not a plain op.
    return dist.ReduceOp.PREMUL_SUM(2.0) if name == "PREMUL_SUM" else getattr(dist.ReduceOp, name)


# --- the collectives, one worker each ------------------------------------------------------

def broadcast(numel: int = 3, dtype: str = "int64") -> dict:
    t = rank_values(dist.get_rank(), numel, dtype)
    before = t.clone()
    dist.broadcast(t, src=ROOT)  # in place: every rank's t now holds the root's values
    return {"before": before, "after": t}


def reduce(numel: int = 3, dtype: str = "int64", op: str = "SUM") -> dict:
    """Only the root's result is defined: gloo uses the other ranks' tensors as scratch."""
    t = rank_values(dist.get_rank(), numel, dtype)
    before = t.clone()
    dist.reduce(t, dst=ROOT, op=reduce_op(op))
    return {"before": before, "after": t}


def all_reduce(numel: int = 3, dtype: str = "int64", op: str = "SUM") -> dict:
    t = rank_values(dist.get_rank(), numel, dtype)
    before = t.clone()
    dist.all_reduce(t, op=reduce_op(op))
    return {"before": before, "after": t}


def gather(numel: int = 3, dtype: str = "int64") -> dict:
    rank, world = _me()
    t = rank_values(rank, numel, dtype)
    # Seed 004: the list must be None on the other ranks and shaped like t on the root.
    out = [torch.zeros_like(t) for _ in range(world)] if rank == ROOT else None
    dist.gather(t, gather_list=out, dst=ROOT)
    return {"before": t, "after": out}


def all_gather(numel: int = 3, dtype: str = "int64") -> dict:
    rank, world = _me()
    t = rank_values(rank, numel, dtype)
    out = [torch.zeros_like(t) for _ in range(world)]
    dist.all_gather(out, t)
    return {"before": t, "after": out}


def all_gather_into_tensor(numel: int = 3, dtype: str = "int64") -> dict:
    """all_gather into one preallocated tensor: no list, no torch.cat afterwards."""
    rank, world = _me()
    t = rank_values(rank, numel, dtype)
    out = torch.zeros(world * numel, dtype=t.dtype)
    dist.all_gather_into_tensor(out, t)
    return {"before": t, "after": out}


def scatter(numel: int = 2, dtype: str = "int64") -> dict:
    """The root splits ``numel * world_size`` values into equal parts, one per rank."""
    rank, world = _me()
    parts = list(rank_values(rank, numel * world, dtype).chunk(world)) if rank == ROOT else None
    out = torch.zeros(numel, dtype=getattr(torch, dtype))
    dist.scatter(out, scatter_list=parts, src=ROOT)
    return {"before": parts, "after": out}


def reduce_scatter(numel: int = 7, dtype: str = "int64", op: str = "SUM") -> dict:
    """Each rank's ``numel`` values, split into world_size parts (unequal when numel is not
    divisible): rank i ends with part i reduced over all ranks."""
    rank, world = _me()
    parts = list(torch.tensor_split(rank_values(rank, numel, dtype), world))
    out = torch.zeros_like(parts[rank])
    dist.reduce_scatter(out, [p.clone() for p in parts], op=reduce_op(op))
    return {"before": parts, "after": out}


def reduce_scatter_tensor(numel: int = 2, dtype: str = "int64", op: str = "SUM") -> dict:
    """One flat input of ``numel * world_size`` values in, ``numel`` reduced values out."""
    rank, world = _me()
    t = rank_values(rank, numel * world, dtype)
    out = torch.zeros(numel, dtype=t.dtype)
    dist.reduce_scatter_tensor(out, t.clone(), op=reduce_op(op))
    return {"before": t, "after": out}


def all_to_all(numel: int = 2, dtype: str = "int64") -> dict:
    """Part j of rank i goes to rank j, as part i: a transpose of the (rank, part) grid."""
    rank, world = _me()
    parts = list(rank_values(rank, numel * world, dtype).chunk(world))
    out = [torch.zeros_like(parts[0]) for _ in range(world)]
    dist.all_to_all(out, parts)
    return {"before": parts, "after": out}


def all_to_all_single(numel: int = 7, dtype: str = "int64") -> dict:
    """all_to_all on one flat tensor, with unequal parts (split sizes) where numel demands."""
    rank, world = _me()
    t = rank_values(rank, numel, dtype)
    sizes = [len(p) for p in torch.tensor_split(t, world)]  # the same on every rank
    out = torch.zeros(sizes[rank] * world, dtype=t.dtype)
    dist.all_to_all_single(out, t, output_split_sizes=[sizes[rank]] * world,
                           input_split_sizes=sizes)
    return {"before": list(t.split(sizes)), "after": list(out.split(sizes[rank]))}


COLLECTIVES = {f.__name__: f for f in (
    broadcast, reduce, all_reduce, gather, all_gather, all_gather_into_tensor, scatter,
    reduce_scatter, reduce_scatter_tensor, all_to_all, all_to_all_single)}
REDUCING = {"reduce", "all_reduce", "reduce_scatter", "reduce_scatter_tensor"}


def tour(dtype: str = "int64") -> dict:
    """Every collective in one run. One the backend lacks becomes {"error": message}: such an
    error is raised on every rank before anything is sent, so the ranks stay in step."""
    results = {}
    for name, demo in COLLECTIVES.items():
        try:
            results[name] = demo(dtype=dtype)
        except RuntimeError as exc:
            results[name] = {"error": short_message(str(exc))}
    return results


def seed_ex2() -> dict:
    """Seed 000's Example 2 (barrier, all_gather, all_reduce, reduce, broadcast), printing
    the lines the seed printed."""
    rank, world = _me()
    if rank == 0:
        print(f"dist.is_available: {dist.is_available()}")
    print(f"rank: {os.environ['RANK']}, {rank}")
    print(f"world_size: {os.environ['WORLD_SIZE']}, {world}")
    dist.barrier()
    reduced = reduce(1)["after"].item()  # every rank calls it; only the root's result counts
    return {"all_gather": [t.item() for t in all_gather(1)["after"]],
            "all_reduce": all_reduce(1)["after"].item(),
            "reduce": reduced if rank == ROOT else None,
            "broadcast": broadcast(1)["after"].item()}


# --- the math, in one process ----------------------------------------------------------------

ANY = "undefined"  # what ``expected`` says where the API promises nothing (reduce off-root)


def combine(tensors, op: str = "SUM") -> torch.Tensor:
    """Element-wise reduction of equally shaped tensors, as a ReduceOp defines it."""
    stack = torch.stack(list(tensors))
    if op == "AVG":
        return stack.mean(0)
    bitwise = {"BAND": torch.bitwise_and, "BOR": torch.bitwise_or, "BXOR": torch.bitwise_xor}
    if op in bitwise:
        return functools.reduce(bitwise[op], stack)
    method = {"SUM": "sum", "PRODUCT": "prod", "MIN": "amin", "MAX": "amax"}[op]
    return getattr(stack, method)(0).to(stack.dtype)  # sum/prod promote int32 to int64


def expected(name: str, befores: list, op: str = "SUM") -> list:
    """Each rank's ``after`` for collective ``name``, given every rank's ``before``."""
    n = len(befores)
    if name == "broadcast":
        return [befores[ROOT]] * n
    if name in ("reduce", "all_reduce"):
        total = combine(befores, op)
        return [total if name == "all_reduce" or r == ROOT else ANY for r in range(n)]
    if name == "gather":
        return [list(befores) if r == ROOT else None for r in range(n)]
    if name == "all_gather":
        return [list(befores)] * n
    if name == "all_gather_into_tensor":
        return [torch.cat(befores)] * n
    if name == "scatter":
        return list(befores[ROOT])
    if name in ("reduce_scatter", "reduce_scatter_tensor"):
        parts = [torch.tensor_split(b, n) if name.endswith("tensor") else b for b in befores]
        return [combine([p[r] for p in parts], op) for r in range(n)]
    if name in ("all_to_all", "all_to_all_single"):
        return [[b[r] for b in befores] for r in range(n)]
    raise ValueError(f"no reference for {name!r}; known: {', '.join(COLLECTIVES)}")


def check(name: str, results: list, op: str = "SUM") -> None:
    """AssertionError naming the collective and rank whose ``after`` breaks the math."""
    befores = [r["before"] for r in results]
    for rank, (got, want) in enumerate(zip((r["after"] for r in results),
                                           expected(name, befores, op))):
        if want is ANY:
            continue
        try:
            torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)
        except AssertionError as exc:
            raise AssertionError(f"{name} on {len(results)} ranks, rank {rank}: expected "
                                 f"{want}, got {got}\n{exc}") from None


# --- which ReduceOps the backend has: really tried --------------------------------------------

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
              "support gather`, as seed 004 found)",
    "scatter": "yes since torch 1.11, built on send/recv",
    "all_to_all": "yes, parts may differ in size"}
GLOO_HISTORY = {
    "reduce_scatter": "before pytorch#149869 (2025): `ProcessGroupGloo does not support "
                      "reduce_scatter`",
    "reduce_scatter_tensor": "emulated as all_reduce + chunk (pytorch#118911)",
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
    rank, world = _me()
    parts = list(torch.tensor_split(rank_values(rank, numel), world))
    out = [torch.zeros_like(parts[rank]) for _ in range(world)]
    dist.all_to_all(out, parts)
    return {"before": parts, "after": out}


def reduce_scatter_via_all_reduce(numel: int = 7) -> dict:
    """reduce_scatter for a backend without it: all_reduce everything, keep your own part.
    Twice the traffic of a real one (all_reduce = reduce_scatter + all_gather)."""
    rank, world = _me()
    t = rank_values(rank, numel)
    dist.all_reduce(t)
    return {"equivalent": torch.tensor_split(t, world)[rank],
            "builtin": reduce_scatter(numel)["after"]}


def all_to_all_via_scatter(numel: int = 2) -> dict:
    """all_to_all for a backend without it: every rank takes one turn as scatter's source."""
    rank, world = _me()
    parts = list(rank_values(rank, numel * world).chunk(world))
    out = [torch.zeros_like(parts[0]) for _ in range(world)]
    for src in range(world):
        dist.scatter(out[src], parts if rank == src else None, src=src)
    return {"equivalent": out, "builtin": all_to_all(numel)["after"]}


# --- the exercise --------------------------------------------------------------------------------

def _exercise_worker(fn, numel: int) -> dict:
    rank, world = _me()
    mine = fn(rank_values(rank, numel, "float32"))
    return {"mine": mine, "builtin": all_gather(numel, "float32")["after"]}


def check_all_gather(fn, world_sizes=(2, 3, 4), numel: int = 3, timeout: float = 30.0) -> str:
    """Runs the learner's ``fn(tensor) -> list of world_size tensors`` on real ranks and
    compares it with dist.all_gather, rank by rank and entry by entry."""
    import ddp_lab
    for n in world_sizes:
        try:
            res = ddp_lab.run(_exercise_worker, n, args=(fn, numel), timeout=timeout,
                              echo=False)
        except ddp_lab.WorkerTimeout as err:
            raise AssertionError(
                f"with {n} ranks your function hung (ranks {err.stuck_ranks} stuck): every "
                "rank must call broadcast the same number of times, with the same src in the "
                "same order.") from None
        except ddp_lab.WorkerError as err:
            raise AssertionError(f"with {n} ranks, rank {err.rank} failed:\n{err.traceback}") \
                from None
        for rank, value in enumerate(res.values):
            _compare_gathered(value["mine"], value["builtin"], n, rank)
    return f"passed on {', '.join(map(str, world_sizes))} ranks"


def _compare_gathered(mine, builtin, n: int, rank: int) -> None:
    where = f"with {n} ranks, rank {rank}"
    if not isinstance(mine, (list, tuple)) or len(mine) != n:
        raise AssertionError(f"{where} returned {mine!r}: expected a list of {n} tensors, "
                             "entry i being rank i's tensor")
    for i, (got, want) in enumerate(zip(mine, builtin)):
        if not (isinstance(got, torch.Tensor) and got.shape == want.shape
                and torch.equal(got, want)):
            raise AssertionError(f"{where}: entry {i} is {got!r}, expected rank {i}'s "
                                 f"tensor {want!r}")
