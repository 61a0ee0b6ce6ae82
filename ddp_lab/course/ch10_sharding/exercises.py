"""Notebook 10's exercises: ZeRO-1's step, and the reduce-scatter of one gradient (ZeRO-2/3).

Each check draws a seed, builds random shapes and values from it in its own process, deals
each rank only its own inputs, runs the learner's function on 1 to 4 real ranks with the
built-ins it replaces switched off, and compares every rank's result, in its own process,
with what one process computes from all ranks' inputs. Both exercises are about what travels,
so both are also judged by the cost that CollectiveTrace records at the dispatcher (however
the collective was reached), from above and below: ZeRO-1's step sends each parameter once,
from its owner; the gradient's shard costs one reduce-scatter. The second exercise lives in
shard_exercise.py.
"""

from __future__ import annotations

import contextlib

import torch
import torch.distributed as dist

from ddp_lab.course.ch10_sharding.shard_exercise import check_shard_gradient, sent, shard_gradient
from ddp_lab.course.collective_trace import CollectiveTrace
from ddp_lab.exercises.builtins_off import refused_everywhere, refusing, replaced
from ddp_lab.exercises.driver import each_world, generator, new_seed
from ddp_lab.exercises.registry import Exercise
from ddp_lab.exercises.sealed import deal
from ddp_lab.scratch.sharded_optimizer import ShardedOptimizer, partition, zero1_step

STEPS = 3
COST_TOLERANCE = 1.25  # the reference moves exactly each parameter once


# --- 10.zero1_step ---------------------------------------------------------------------------

def _random_params(seed: int, layout: tuple[int, bool]) -> list[torch.Tensor]:
    """``count`` trained parameters of random shapes (1-D or 2-D, sides 2-6), then, with
    ``extras``, one frozen (no requires_grad) and one unused (requires_grad, never a
    gradient): the optimizer skips both, and they still have owners."""
    count, extras = layout
    g = generator(seed, count, extras)
    params = []
    for _ in range(count + 2 * extras):
        dims = int(torch.randint(1, 3, (1,), generator=g))
        shape = tuple(int(s) for s in torch.randint(2, 7, (dims,), generator=g))
        params.append(torch.randn(shape, generator=g).requires_grad_())
    if extras:
        params[count].requires_grad_(False)
    return params


def _layouts(world: int) -> list[tuple[int, bool]]:
    """(trained parameters, frozen and unused ones too) of each phase: five with both
    extras; then, on 2+ ranks, one parameter fewer than the ranks, so that the last rank
    owns none and gets ``local_optimizer=None``."""
    return [(5, True)] + ([(world - 1, False)] if world > 1 else [])


def _gradient(shape, seed: int, step: int, rank: int, k: int) -> torch.Tensor:
    """Rank ``rank``'s gradient of parameter ``k``: a multiple of 1/256, so that the sum
    over the ranks is exact in float32 in any order. The all-reduce and the reference then
    average the very same values; a rounded sum near 0 would otherwise move Adam's first
    step, g / (|g| + eps), by far more than the comparison allows (a test run drew one)."""
    g = torch.randn(shape, generator=generator(seed, step, rank, k))
    return torch.round(g * 256) / 256


def _phase(seed: int, world: int, layout: tuple[int, bool]) -> dict:
    """One phase's inputs, made in the checker's process: the parameters' initial values and,
    per step, the averaged gradients (what DDP's all-reduce would leave on every rank)."""
    count = layout[0]
    initial = [p.detach() for p in _random_params(seed, layout)]
    grads = [[sum(_gradient(initial[k].shape, seed, step, r, k) for r in range(world)) / world
              for k in range(count)] for step in range(STEPS)]
    return {"layout": layout, "initial": initial, "grads": grads}


def _dealt(seed: int, world: int):
    """Every rank is dealt the same parameters and averaged gradients: ranks that ran DDP's
    all-reduce hold just that. The updated values are the checker's, computed here."""
    phases = [_phase(seed, world, layout) for layout in _layouts(world)]
    return deal([phases] * world)


def _zero1_trial(fn, dealt) -> list[dict]:
    rank, world = dist.get_rank(), dist.get_world_size()
    return [_zero1_phase(fn, phase, rank, world) for phase in dealt.take()]


def _zero1_phase(fn, phase: dict, rank: int, world: int) -> dict:
    """Every step: the averaged gradients, then the learner's step under a CollectiveTrace;
    returns every parameter after every step, the owners and what each step moved."""
    count, extras = phase["layout"]
    params = [t.clone().requires_grad_(not (extras and k == count))  # one frozen
              for k, t in enumerate(phase["initial"])]
    owners = partition([p.numel() for p in params], world)
    mine = [p for p, owner in zip(params, owners) if owner == rank]
    local = torch.optim.Adam(mine, lr=0.1) if mine else None
    history, moved = [], []
    for grads in phase["grads"]:
        for p, grad in zip(params, grads):
            p.grad = grad.clone()
        with _no_sharded_optimizer(), CollectiveTrace(forbid=("all_reduce", "reduce_scatter"),
                                                      why=FORBIDDEN_WHY) as trace:
            _call_step(fn, params, owners, local)
        moved.append(_moved(trace))
        history.append([p.detach().clone() for p in params])
    return {"owners": owners, "history": history, "moved": moved}


def _reference(phase: dict) -> list[list[torch.Tensor]]:
    """One process's Adam over every parameter, step by step: what every rank must hold."""
    params = [t.clone().requires_grad_() for t in phase["initial"]]
    optimizer, history = torch.optim.Adam(params, lr=0.1), []
    for grads in phase["grads"]:
        for p, grad in zip(params, grads):
            p.grad = grad.clone()
        optimizer.step()
        history.append([p.detach().clone() for p in params])
    return history


FORBIDDEN_WHY = ("the gradients are already averaged; only the updated parameters need to "
                 "travel, from their owners")


def _call_step(fn, params, owners, local) -> None:
    """The learner's step; a rank that owns nothing and still steps hears why it failed."""
    try:
        fn(params, owners, local)
    except AttributeError as err:
        if local is None and "NoneType" in str(err):
            count = f"{len(params)} parameter{'s' * (len(params) != 1)}"
            raise RuntimeError(f"{err}: this rank owns no parameter here ({count} on "
                               f"{dist.get_world_size()} ranks), so its "
                               "local_optimizer is None; step it only when it is not None, "
                               "and still take part in every collective") from err
        raise


def _moved(trace: CollectiveTrace) -> dict:
    calls = trace.moving_data()
    return {"sent": sum(sent(c) for c in calls), "families": trace.family_counts(),
            "dtypes": sorted({str(c.dtype) for c in calls if c.dtype is not None})}


def _no_sharded_optimizer():
    """The scratch ShardedOptimizer's step refuses while the learner's step runs (patched
    on the class, which every imported name shares), and so does the scratch zero1_step it
    calls, however it is imported (the reference too: a solved cell is its own function).
    torch's ZeroRedundancyOptimizer is no shortcut for a step over given parameters."""
    why = "write ZeRO-1's step yourself: the local step, then the parameters travel"
    stack = contextlib.ExitStack()
    stack.enter_context(replaced(ShardedOptimizer, "step", refusing("ShardedOptimizer.step",
                                                                    why)))
    stack.enter_context(refused_everywhere(zero1_step, "scratch.sharded_optimizer.zero1_step",
                                           why))
    return stack


def _mismatches(phases: list[dict], phase: dict) -> list[tuple]:
    """(rank, step, index, got, expected, previous, owner) of every parameter value that
    differs from the reference, over every rank's run of one phase, in order."""
    found, reference = [], _reference(phase)
    for rank, run in enumerate(phases):
        previous = phase["initial"]
        for step, (got, expected) in enumerate(zip(run["history"], reference)):
            for k, (g, e) in enumerate(zip(got, expected)):
                if not torch.allclose(g, e, rtol=1e-5, atol=1e-6):
                    found.append((rank, step, k, g, e, previous[k], run["owners"][k]))
            previous = got
    return found


def _zero1_problem(mismatches: list, dtypes: list) -> str:
    """The most telling mistake first: a downcast, broadcasting from rank 0, an owner that
    never updated, a rank that never received; then anything else."""
    narrow = [d for d in dtypes if d != "torch.float32"]
    if narrow:
        return (f"rank {mismatches[0][0]}: the parameters travelled as {', '.join(narrow)}: "
                "send them in their own dtype (float32), or the receivers hold rounded values")
    if all(owner != 0 for *_, owner in mismatches):
        rank, step, k, *_, owner = mismatches[0]
        return (f"rank {rank}, step {step}: the parameters rank 0 owns are right, but "
                f"parameter {k}, owned by rank {owner}, is not: each parameter's new value "
                "comes from its owner, not from rank 0")
    for rank, step, k, got, _, previous, owner in mismatches:
        if owner == rank and torch.equal(got, previous):
            return (f"rank {rank}, step {step}: parameter {k}, which rank {rank} owns, did "
                    "not change: the owner must run its local optimizer before sharing")
    rank, step, k, got, expected, previous, owner = mismatches[0]
    if torch.equal(got, previous):
        return (f"rank {rank}, step {step}: parameter {k} (owned by rank {owner}) still holds "
                "its old value: every parameter's new value must reach every rank, from its "
                "owner")
    return (f"rank {rank}, step {step}: parameter {k} (owner: rank {owner}) should be "
            f"{expected.flatten()[:4].tolist()}..., got {got.flatten()[:4].tolist()}...: "
            "share the values after the owner's step, from the owner")


def _zero1_cost_problem(phases: list[dict], phase: dict, n: int) -> str | None:
    """Each step sends each parameter once from its owner to the n - 1 others: a broadcast
    per parameter makes the ranks send (n-1) x the parameters' bytes in all (a ring's
    share per rank, summed; point-to-point sends from the owner add up the same). More is
    a costlier exchange; less, with every value right, means a rank computed what it does
    not own itself."""
    count, nbytes = phase["layout"][0], [t.numel() * t.element_size() for t in phase["initial"]]
    most, least = (n - 1) * sum(nbytes), (n - 1) * sum(nbytes[:count])
    for step, made in enumerate(phases[0]["moved"]):
        total = sum(run["moved"][step]["sent"] for run in phases)
        families = made["families"] or "no collective"
        if total > COST_TOLERANCE * most:
            return (f"in step {step} the ranks sent {total:.0f} bytes in all ({families} on "
                    f"rank 0); one broadcast per parameter from its owner sends {most:.0f}: "
                    "each rank needs each new value once, from the one rank that computed it")
        if total < 0.99 * least:
            return (f"in step {step} the ranks sent only {total:.0f} bytes in all ({families} "
                    f"on rank 0), yet the updated parameters must reach the ranks that do not "
                    f"own them ({least:.0f} bytes): a rank that updates what it does not "
                    "own holds that optimizer state, which is what ZeRO-1 removes. Step only "
                    "local_optimizer and receive the rest")
    return None


def _zero1_world_problem(values: list, n: int, seed: int) -> str | None:
    for index, layout in enumerate(_layouts(n)):
        phase, phases = _phase(seed, n, layout), [runs[index] for runs in values]
        owners = f"{len(phases[0]['owners'])} parameters (owners {phases[0]['owners']})"
        mismatches = _mismatches(phases, phase)
        if mismatches:
            dtypes = sorted({d for p in phases for m in p["moved"] for d in m["dtypes"]})
            return f", {owners}, {_zero1_problem(mismatches, dtypes)}"
        problem = _zero1_cost_problem(phases, phase, n) if n > 1 else None
        if problem:
            return f", {owners}: {problem}"
    return None


def check_zero1_step(fn) -> str:
    seed = new_seed()
    each_world(_zero1_trial, lambda n: (fn, _dealt(seed, n)), seed=seed,
               judge_world=lambda values, n: _zero1_world_problem(values, n, seed),
               hang_hint="Every rank must take part in the same collectives, in the same "
                         "order, owner or not.")
    return (f"every rank holds what one process's Adam gives, {STEPS} steps on 1 to 4 ranks, "
            f"ranks that own nothing and frozen parameters included, each parameter sent once "
            f"(seed {seed})")


EXERCISES = (
    Exercise(
        name="10.zero1_step", notebook="10_sharding",
        summary="zero1_step(params, owners, local_optimizer): update your share, then share it",
        hint="Only the owner of a parameter can update it, and only the owner holds its new "
             "value: which collective copies one rank's tensor to all the others? Mind the "
             "rank whose local_optimizer is None.",
        recipe="1. If local_optimizer is not None, call local_optimizer.step(): it updates "
               "exactly the parameters this rank owns.\n2. Then, on every rank and in the same "
               "order, for i, p in enumerate(params): dist.broadcast(p.data, src=owners[i]). "
               "The owner sends, everyone else receives into p.data. Each parameter crosses "
               "once; nothing else needs to travel (the gradients were averaged before).",
        solution=zero1_step, checker=check_zero1_step,
        answered_by=("ddp_lab.scratch.sharded_optimizer:ShardedOptimizer.step",
                     "ddp_lab.scratch.sharded_optimizer:zero1_step")),
    Exercise(
        name="10.shard_gradient", notebook="10_sharding",
        summary="shard_gradient(full_grad): this rank's averaged shard, by one reduce-scatter",
        hint="One collective both sums over the ranks and hands each rank only its part. "
             "Before it, make the gradient 1-D and a multiple of world_size long; after it, "
             "the sum still has to become an average.",
        recipe="1. flat = full_grad.flatten(), then F.pad(flat, (0, (-flat.numel()) % world)) "
               "so it splits evenly (world = dist.get_world_size()).\n2. shard = "
               "torch.empty(flat.numel() // world, dtype=flat.dtype).\n3. "
               "dist.reduce_scatter_single(shard, flat): rank r receives the sum of every "
               "rank's part r (the older name reduce_scatter_tensor still works in torch "
               "2.13: it forwards here with a FutureWarning).\n4. return shard / world.",
        solution=shard_gradient, checker=check_shard_gradient,
        answered_by=("ddp_lab.scratch.fsdp:_GatherParam.backward",
                     "ddp_lab.scratch.fsdp:FSDP.sync_gradients")),
)
