"""The math each collective must follow, computed in one process from what the ranks held
before the call; ``check`` compares the ranks' real results with it."""

from __future__ import annotations

import functools

import torch

from ddp_lab.course.ch03_collectives.collectives import COLLECTIVES, ROOT

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
    if name == "all_gather_single":
        return [torch.cat(befores)] * n
    if name == "scatter":
        return list(befores[ROOT])
    if name in ("reduce_scatter", "reduce_scatter_single"):
        parts = [torch.tensor_split(b, n) if name.endswith("single") else b for b in befores]
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
