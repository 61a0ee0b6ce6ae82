"""Notebook 11's exercise: the row-parallel linear layer's forward and backward.

Each rank holds a slice of the input's features and the matching columns of the weight; the
full output is the sum of the ranks' partial products plus the bias, on every rank, and the
gradients must reach each rank's slices. The check runs the learner's function on 1 to 4
ranks with random sizes, the row-parallel layers of torch and of ``ddp_lab.scratch``
switched off, and compares the output and every gradient with one unsharded Linear.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from ddp_lab import scratch
from ddp_lab.exercises.builtins_off import refusing, replaced
from ddp_lab.exercises.driver import WORLD_SIZES, generator, new_seed, run_ranks, where
from ddp_lab.exercises.registry import Exercise, ExerciseFailed

# Ranks import torch's distributed optim/tensor packages first: seconds each on a busy laptop.
CHECK_TIMEOUT = 60.0


def row_parallel_linear(x_slice, weight_slice, bias):
    """Reference: all-reduce the partial product in forward, and let the gradient through
    unchanged in backward (every rank's output gradient is already the full one)."""
    partial = x_slice @ weight_slice.T
    total = partial.detach().clone()
    dist.all_reduce(total)
    return partial + (total - partial).detach() + bias  # value: the sum; gradient: identity


def _problem_inputs(seed: int, world: int):
    g = generator(seed)
    batch, per_rank, out = (int(v) for v in torch.randint(2, 6, (3,), generator=g))
    x = torch.randn(batch, per_rank * world, generator=g)
    weight = torch.randn(out, per_rank * world, generator=g)
    bias = torch.randn(out, generator=g)
    upstream = torch.randn(batch, out, generator=g)  # d loss / d output
    return x, weight, bias, upstream


def _row_trial(fn, seed: int) -> dict:
    rank, world = dist.get_rank(), dist.get_world_size()
    x, weight, bias, upstream = _problem_inputs(seed, world)
    x_slice = x.chunk(world, dim=1)[rank].clone().requires_grad_()
    w_slice = weight.chunk(world, dim=1)[rank].clone().requires_grad_()
    b = bias.clone().requires_grad_()
    why = "write the row-parallel layer yourself from x_slice @ weight_slice.T and an all-reduce"
    with replaced(scratch.RowParallelLinear, "forward", refusing("scratch.RowParallelLinear", why)):
        with _no_rowwise_parallel(why):
            out = fn(x_slice, w_slice, b)
            if isinstance(out, torch.Tensor) and out.requires_grad:
                (out * upstream).sum().backward()
    return {"out": out.detach() if isinstance(out, torch.Tensor) else out,
            "x_grad": x_slice.grad, "w_grad": w_slice.grad, "b_grad": b.grad}


def _no_rowwise_parallel(why: str):
    from torch.distributed.tensor import parallel
    return replaced(parallel, "RowwiseParallel", refusing("RowwiseParallel", why))


def _expected(seed: int, world: int) -> dict:
    x, weight, bias, upstream = _problem_inputs(seed, world)
    x, weight, bias = (t.requires_grad_() for t in (x, weight, bias))
    out = x @ weight.T + bias
    (out * upstream).sum().backward()
    return {"out": out.detach(), "x_grads": x.grad.chunk(world, dim=1),
            "w_grads": weight.grad.chunk(world, dim=1), "b_grad": bias.grad, "bias": bias.detach(),
            "partials": [xs @ ws.T for xs, ws in zip(x.detach().chunk(world, dim=1),
                                                    weight.detach().chunk(world, dim=1))]}


def _close(a, b) -> bool:
    return isinstance(a, torch.Tensor) and a.shape == b.shape and torch.allclose(a, b, rtol=1e-4, atol=1e-5)


def _forward_problem(got, want: dict, rank: int, n: int) -> str | None:
    if _close(got, want["out"]):
        return None
    if _close(got, want["partials"][rank] + want["bias"]):
        return "the output is only this rank's partial product: all-reduce (sum) it over the ranks"
    if _close(got, want["out"] + (n - 1) * want["bias"]):
        return f"the bias was added {n} times: add it once, after the all-reduce"
    if _close(got, (want["out"] - want["bias"]) / n + want["bias"]):
        return f"the partial products were averaged: the layer's output is their sum"
    shape = tuple(got.shape) if isinstance(got, torch.Tensor) else type(got).__name__
    return f"the output should be x @ W.T + b of shape {tuple(want['out'].shape)}, got {shape}"


def _backward_problem(got: dict, want: dict, rank: int, n: int) -> str | None:
    for name, mine, expected in (("x_slice", got["x_grad"], want["x_grads"][rank]),
                                 ("weight_slice", got["w_grad"], want["w_grads"][rank]),
                                 ("bias", got["b_grad"], want["b_grad"])):
        if mine is None:
            return (f"no gradient reached {name}: the output must stay connected to the "
                    "partial product x_slice @ weight_slice.T in autograd's graph (a custom "
                    "autograd.Function, or partial + (total - partial).detach()), not be a "
                    "detached copy")
        if _close(mine, expected):
            continue
        if n > 1 and _close(mine, expected * n):
            return (f"the gradient of {name} is {n}x too large: in backward every rank already "
                    "has the full output gradient, so the all-reduce's backward is the identity "
                    "(torch.distributed.nn.all_reduce sums the gradients again)")
        return f"the gradient of {name} differs from the unsharded Linear's"
    return None


def check_row_parallel(fn) -> str:
    seed = new_seed()
    for n in WORLD_SIZES:
        on = where(n, seed)
        want = _expected(seed, n)
        values = run_ranks(_row_trial, n, (fn, seed), where=on, timeout=CHECK_TIMEOUT,
                           hang_hint="Every rank must make the same all-reduce.")
        for rank, got in enumerate(values):
            problem = _forward_problem(got["out"], want, rank, n) or _backward_problem(got, want, rank, n)
            if problem:
                raise ExerciseFailed(f"{on}, rank {rank}: {problem}")
    return f"output and every gradient equal an unsharded Linear on 1 to 4 ranks (seed {seed})"


EXERCISES = (
    Exercise(
        name="11.row_parallel", notebook="11_device_meshes",
        summary="row_parallel_linear(x_slice, weight_slice, bias): full output, gradients to the slices",
        hint="partial = x_slice @ weight_slice.T; all-reduce a detached copy; return a tensor whose "
             "value is the sum and whose gradient flows to partial unchanged, plus the bias once.",
        solution=row_parallel_linear, checker=check_row_parallel,
        answered_by=("ddp_lab.scratch.tensor_parallel:_ReduceFromParallel",
                     "ddp_lab.scratch.tensor_parallel:RowParallelLinear.forward")),
)
