"""Notebook 10's exercises: ZeRO-1's step, and the reduce-scatter of one gradient (ZeRO-2/3).

Each check draws a seed, builds random shapes and values from it, runs the learner's function
on 1 to 4 real ranks with the built-ins it replaces switched off, and compares every rank's
result with what one process computes from all ranks' inputs.
"""

from __future__ import annotations

import contextlib

import torch
import torch.distributed as dist
import torch.nn.functional as F

from ddp_lab.exercises.builtins_off import refusing, replaced, switched_off
from ddp_lab.exercises.driver import WORLD_SIZES, generator, new_seed, run_ranks, where
from ddp_lab.exercises.registry import Exercise, ExerciseFailed
from ddp_lab.scratch.sharded_optimizer import ShardedOptimizer, partition

# Ranks import torch's distributed optim/tensor packages first: seconds each on a busy laptop.
CHECK_TIMEOUT = 60.0
STEPS = 3


# --- 10.zero1_step ---------------------------------------------------------------------------

def zero1_step(params, owners, local_optimizer):
    """Reference: the owner updates its parameters, then every owner broadcasts them."""
    if local_optimizer is not None:
        local_optimizer.step()
    for p, owner in zip(params, owners):
        dist.broadcast(p.data, src=owner)


def _random_params(seed: int) -> list[torch.Tensor]:
    """Five parameters of random shapes (1-D or 2-D, sides 2-6), the same on every rank."""
    g = generator(seed)
    params = []
    for _ in range(5):
        dims = int(torch.randint(1, 3, (1,), generator=g))
        shape = tuple(int(s) for s in torch.randint(2, 7, (dims,), generator=g))
        params.append(torch.randn(shape, generator=g).requires_grad_())
    return params


def _set_grads(params, seed: int, step: int, rank: int) -> None:
    for k, p in enumerate(params):
        p.grad = torch.randn(p.shape, generator=generator(seed, step, rank, k))


def _zero1_trial(fn, seed: int) -> dict:
    """Every step: random gradients per rank, averaged (as DDP would), then the learner's
    step; returns every parameter after every step, the owners, and the reference's."""
    rank, world = dist.get_rank(), dist.get_world_size()
    params, ref = _random_params(seed), _random_params(seed)
    owners = partition([p.numel() for p in params], world)
    mine = [p for p, owner in zip(params, owners) if owner == rank]
    local = torch.optim.Adam(mine, lr=0.1) if mine else None
    ref_optimizer = torch.optim.Adam(ref, lr=0.1)
    history = []
    for step in range(STEPS):
        _set_grads(params, seed, step, rank)
        for p in params:
            dist.all_reduce(p.grad)
            p.grad /= world
        with _no_sharded_optimizers():
            fn(params, owners, local)
        ref_grads = [sum(torch.randn(p.shape, generator=generator(seed, step, r, k))
                         for r in range(world)) / world for k, p in enumerate(ref)]
        for p, grad in zip(ref, ref_grads):
            p.grad = grad
        ref_optimizer.step()
        history.append(([p.detach().clone() for p in params], [p.detach().clone() for p in ref]))
    return {"owners": owners, "history": history, "initial": [p.detach() for p in _random_params(seed)]}


def _no_sharded_optimizers() -> contextlib.ExitStack:
    """The scratch ShardedOptimizer's step and the gradient reductions refuse while the
    learner's step runs. (torch's ZeroRedundancyOptimizer is no shortcut for a step over
    given parameters; importing torch.distributed.optim to switch it off would cost every
    rank seconds of TorchScript compilation.)"""
    stack = contextlib.ExitStack()
    why = "write ZeRO-1's step yourself: local_optimizer.step(), then broadcasts"
    stack.enter_context(replaced(ShardedOptimizer, "step", refusing("ShardedOptimizer.step", why)))
    stack.enter_context(switched_off(("all_reduce", "reduce_scatter", "reduce_scatter_tensor"),
                                     "the gradients are already averaged; only the updated "
                                     "parameters need to travel"))
    return stack


def _mismatches(values: list) -> list[tuple]:
    """(rank, step, index, got, expected, previous, owner) of every parameter value that
    differs from the reference, in order."""
    found = []
    for rank, v in enumerate(values):
        previous = v["initial"]
        for step, (got, expected) in enumerate(v["history"]):
            for k, (g, e) in enumerate(zip(got, expected)):
                if not torch.allclose(g, e, rtol=1e-5, atol=1e-6):
                    found.append((rank, step, k, g, e, previous[k], v["owners"][k]))
            previous = got
    return found


def _zero1_problem(mismatches: list) -> str:
    """The most telling mistake first: broadcasting from rank 0, an owner that never
    updated, a rank that never received; then anything else."""
    if all(owner != 0 for *_, owner in mismatches):
        rank, step, k, *_, owner = mismatches[0]
        return (f"rank {rank}, step {step}: the parameters rank 0 owns are right, but parameter "
                f"{k}, owned by rank {owner}, is not: broadcast each parameter from its owner, "
                "src=owners[i], not from rank 0")
    for rank, step, k, got, _, previous, owner in mismatches:
        if owner == rank and torch.equal(got, previous):
            return (f"rank {rank}, step {step}: parameter {k}, which rank {rank} owns, did not "
                    "change: call local_optimizer.step() before broadcasting")
    rank, step, k, got, expected, previous, owner = mismatches[0]
    if torch.equal(got, previous):
        return (f"rank {rank}, step {step}: parameter {k} (owned by rank {owner}) still holds "
                f"its old value: broadcast every parameter from its owner, src=owners[i]")
    return (f"rank {rank}, step {step}: parameter {k} (owner: rank {owner}) should be "
            f"{expected.flatten()[:4].tolist()}..., got {got.flatten()[:4].tolist()}...: "
            "broadcast after the step, from src=owners[i]")


def check_zero1_step(fn) -> str:
    seed = new_seed()
    for n in WORLD_SIZES:
        on = where(n, seed)
        values = run_ranks(_zero1_trial, n, (fn, seed), where=on, timeout=CHECK_TIMEOUT,
                           hang_hint="Every rank must call dist.broadcast for every "
                                     "parameter, in the same order.")
        mismatches = _mismatches(values)
        if mismatches:
            raise ExerciseFailed(f"{on}, {_zero1_problem(mismatches)}")
    return f"every rank holds what one process's Adam gives, {STEPS} steps on 1 to 4 ranks (seed {seed})"


# --- 10.shard_gradient -----------------------------------------------------------------------

def shard_gradient(full_grad):
    """Reference: flatten, zero-pad to a multiple of the world size, reduce-scatter, average."""
    world = dist.get_world_size()
    flat = F.pad(full_grad.flatten(), (0, (-full_grad.numel()) % world))
    shard = torch.empty(flat.numel() // world, dtype=flat.dtype)
    dist.reduce_scatter_tensor(shard, flat)
    return shard / world


def _shape(seed: int, trial: int) -> tuple[int, ...]:
    """Random shapes; the first has 35 elements, which 2, 3 and 4 ranks cannot split evenly."""
    if trial == 0:
        return (5, 7)
    g = generator(seed, trial)
    dims = int(torch.randint(1, 4, (1,), generator=g))
    return tuple(int(s) for s in torch.randint(1, 6, (dims,), generator=g))


def _shard_trial(fn, seed: int) -> list:
    rank, world = dist.get_rank(), dist.get_world_size()
    results = []
    for trial in range(3):
        shape = _shape(seed, trial)
        grads = [torch.randn(shape, generator=generator(seed, trial, r)) for r in range(world)]
        with switched_off(("all_reduce", "all_gather", "all_gather_into_tensor", "reduce"),
                          "each rank needs only its own shard: use dist.reduce_scatter_tensor"):
            got = fn(grads[rank].clone())
        average = F.pad(torch.stack(grads).mean(0).flatten(), (0, (-grads[0].numel()) % world))
        results.append({"shape": shape, "got": got, "expected": average.chunk(world)[rank],
                        "own": F.pad(grads[rank].flatten(), (0, (-grads[0].numel()) % world)).chunk(world)[rank],
                        "chunks": average.chunk(world)})
    return results


def _shard_problem(r: dict, rank: int, n: int) -> str | None:
    got, want = r["got"], r["expected"]
    if not isinstance(got, torch.Tensor) or got.shape != want.shape:
        shape = tuple(got.shape) if isinstance(got, torch.Tensor) else type(got).__name__
        return (f"expected a 1-D shard of {want.numel()} values (ceil({r['shape']} elements / "
                f"{n})), got {shape}: flatten, pad with zeros to a multiple of {n}, split")
    if torch.allclose(got, want, rtol=1e-5, atol=1e-6):
        return None
    if torch.allclose(got, want * n, rtol=1e-5, atol=1e-5):
        return f"the shard is {n}x too large: reduce_scatter sums; divide by the world size"
    if torch.allclose(got, r["own"], rtol=1e-5, atol=1e-6):
        return "that is this rank's own gradient: it was never reduced across the ranks"
    for other, chunk in enumerate(r["chunks"]):
        if other != rank and torch.allclose(got, chunk, rtol=1e-5, atol=1e-6):
            return f"that is rank {other}'s shard: rank {rank} must get part [{rank}]"
    return f"expected {want.tolist()}, got {got.tolist()}"


def check_shard_gradient(fn) -> str:
    seed = new_seed()
    for n in WORLD_SIZES:
        on = where(n, seed)
        values = run_ranks(_shard_trial, n, (fn, seed), where=on, timeout=CHECK_TIMEOUT,
                           hang_hint="Every rank must call the same collective with tensors "
                                     "of the same size.")
        for rank, results in enumerate(values):
            for r in results:
                problem = _shard_problem(r, rank, n)
                if problem:
                    raise ExerciseFailed(f"{on}, rank {rank}, a gradient of shape {r['shape']}: {problem}")
    return f"every rank got its averaged shard, 3 shapes on 1 to 4 ranks (seed {seed})"


EXERCISES = (
    Exercise(
        name="10.zero1_step", notebook="10_sharding",
        summary="zero1_step(params, owners, local_optimizer): update your share, then share it",
        hint="local_optimizer.step() if you own anything, then for every parameter "
             "dist.broadcast(p.data, src=owners[i]) on every rank.",
        solution=zero1_step, checker=check_zero1_step,
        answered_by=("ddp_lab.scratch.sharded_optimizer:ShardedOptimizer.step",)),
    Exercise(
        name="10.shard_gradient", notebook="10_sharding",
        summary="shard_gradient(full_grad): this rank's averaged shard, by one reduce-scatter",
        hint="flatten, F.pad to a multiple of world_size, dist.reduce_scatter_tensor into a "
             "buffer of numel // world_size, then divide by world_size.",
        solution=shard_gradient, checker=check_shard_gradient,
        answered_by=("ddp_lab.scratch.fsdp:_GatherParam.backward",
                     "ddp_lab.scratch.fsdp:FSDP.sync_gradients")),
)
