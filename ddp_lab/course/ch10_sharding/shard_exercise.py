"""Notebook 10's second exercise: one gradient, reduce-scattered, as ZeRO-2 and ZeRO-3 do.

The check runs the learner's ``shard_gradient`` on 1 to 4 ranks, on a gradient whose size
does not split evenly, one smaller than the world (the last ranks' shards are all padding)
and a random one, with the all-reduce, the all-gather and the reduce switched off in every
form. The gradients are made in the checker's process, each rank dealt only its own; there it
compares each rank's shard with the average, then the cost that CollectiveTrace recorded: one
collective, and as many bytes as a reduce-scatter sends ((n-1)/n of the padded gradient per
rank), no more and no fewer, in the gradient's own dtype. N broadcasts of the
whole gradient, or an all-to-all of whole copies, give the right shard at n times the cost.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F

from ddp_lab.course.collective_trace import CollectiveTrace
from ddp_lab.exercises.driver import each_world, generator, new_seed, tensor_problem
from ddp_lab.exercises.sealed import deal
from ddp_lab.scratch.fsdp import padded_flat

FORBIDDEN = ("all_reduce", "all_gather", "reduce")
WHY = "each rank needs only its own shard of the sum: one collective sums and splits at once"
COST_TOLERANCE = 1.25  # the reference sends exactly (n-1)/n of the padded gradient
TRIALS = 3


def shard_gradient(full_grad):
    """Reference: flatten, zero-pad to a multiple of the world size, reduce-scatter, average."""
    world = dist.get_world_size()
    flat = F.pad(full_grad.flatten(), (0, (-full_grad.numel()) % world))
    shard = torch.empty(flat.numel() // world, dtype=flat.dtype)
    dist.reduce_scatter_single(shard, flat)
    return shard / world


def _shape(seed: int, trial: int) -> tuple[int, ...]:
    """35 elements (2, 3 and 4 ranks cannot split them evenly), then 3 (on 4 ranks the last
    shard is padding only), then a random shape."""
    if trial < 2:
        return ((5, 7), (3,))[trial]
    g = generator(seed, trial)
    dims = int(torch.randint(1, 4, (1,), generator=g))
    return tuple(int(s) for s in torch.randint(1, 6, (dims,), generator=g))


def sent(call) -> float:
    """Bytes this rank sends for one call by the design of the collective it chose (a
    ring's share, CollectiveCall.bytes_per_rank), its list counted whole. What gloo runs
    underneath is not held against the learner: in torch 2.13 it has no reduce-scatter of
    its own and runs an all-reduce (notebook 03, reduce_scatter_underneath)."""
    return call.bytes_per_rank * call.whole_nbytes / call.nbytes if call.nbytes else 0.0


def _call(fn, grad: torch.Tensor):
    """The learner's function; gloo's size check of a reduce-scatter (ProcessGroupGloo.cpp:
    ``outputShape[0] * worldSize == inputShape[0]``) is explained in words."""
    try:
        return fn(grad)
    except RuntimeError as err:
        if "worldSize == inputShape" in str(err):
            world = dist.get_world_size()
            raise RuntimeError(f"{err}\nthe input of a reduce-scatter must be exactly "
                               f"world_size x the output: {grad.numel()} elements do not split "
                               f"over {world} ranks; pad the flat gradient with zeros to a "
                               f"multiple of {world} first") from err
        raise


def _gradients(seed: int, world: int) -> list[list[torch.Tensor]]:
    """Every trial's gradient on every rank, ``[trial][rank]``."""
    return [[torch.randn(_shape(seed, trial), generator=generator(seed, trial, r))
             for r in range(world)] for trial in range(TRIALS)]


def _dealt(seed: int, world: int):
    """Made here, in the checker's process: each rank gets its own gradients only."""
    every = _gradients(seed, world)
    return deal([[grads[rank] for grads in every] for rank in range(world)])


def _shard_trial(fn, dealt) -> list:
    """The learner's function on each of this rank's gradients: what it returned and what
    it sent; the expected shards are the checker's."""
    results = []
    for grad in dealt.take():
        with CollectiveTrace(forbid=FORBIDDEN, why=WHY) as trace:
            got = _call(fn, grad)
        if isinstance(got, torch.Tensor):
            got = got.detach().clone()  # an AsyncCollectiveTensor waits here, a plain one copies
        results.append({"got": got, "calls": [(c.family, sent(c), c.dtype)
                                               for c in trace.moving_data()]})
    return results


def _expected(seed: int, world: int, rank: int) -> list[dict]:
    """Per trial: the shape, this rank's averaged shard, its own gradient's part, every
    rank's shard, and the padded gradient's bytes."""
    found = []
    for trial, grads in enumerate(_gradients(seed, world)):
        average = padded_flat(torch.stack(grads).mean(0), world)
        found.append({"shape": _shape(seed, trial), "expected": average.chunk(world)[rank],
                      "own": padded_flat(grads[rank], world).chunk(world)[rank],
                      "chunks": average.chunk(world), "padded_bytes": average.numel() * 4})
    return found


def _shard_problem(r: dict, rank: int, n: int) -> str | None:
    got, want = r["got"], r["expected"]  # r: what the rank returned, and what it should
    narrow = sorted({str(dtype) for _, _, dtype in r["calls"]
                     if dtype is not None and dtype.itemsize < 4})
    if narrow:
        return (f"the gradient travelled as {', '.join(narrow)}: that halves the bytes by "
                "dropping precision (the shard must equal the float32 average to 1e-5); send "
                "it in its own dtype")
    if not isinstance(got, torch.Tensor) or got.shape != want.shape or got.dtype != want.dtype:
        kind = (f"{got.dtype} of shape {tuple(got.shape)}" if isinstance(got, torch.Tensor)
                else type(got).__name__)
        return (f"expected a 1-D float32 shard of {want.numel()} values (ceil({r['shape']} "
                f"elements / {n})), got {kind}: flatten, pad with zeros to a multiple of {n}, "
                "split")
    if torch.allclose(got, want, rtol=1e-5, atol=1e-6):
        return None
    if torch.allclose(got, want * n, rtol=1e-5, atol=1e-5):
        return f"the shard is {n}x too large: the collective sums; divide by the world size"
    if torch.allclose(got, r["own"], rtol=1e-5, atol=1e-6):
        return "that is this rank's own gradient: it was never reduced across the ranks"
    for other, chunk in enumerate(r["chunks"]):
        if other != rank and torch.allclose(got, chunk, rtol=1e-5, atol=1e-6):
            return f"that is rank {other}'s shard: rank {rank} must get part [{rank}]"
    return tensor_problem(got, want, exact=False)  # one line; the tensors in ex.last_failure()


def _cost_problem(r: dict, n: int) -> str | None:
    """One collective, at most a reduce-scatter's bytes (point-to-point answers are judged
    by their bytes alone: a ring of sends is a reduce-scatter too)."""
    collectives = [family for family, _, _ in r["calls"] if family not in ("send", "recv")]
    made = ", ".join(f"{collectives.count(f)} {f}" for f in dict.fromkeys(collectives))
    if len(collectives) > 1:
        return (f"it made {len(collectives)} collectives ({made}): one reduce-scatter sums "
                "over the ranks and hands each rank its part in a single collective")
    total, budget = sum(b for _, b, _ in r["calls"]), (n - 1) / n * r["padded_bytes"]
    if total > COST_TOLERANCE * budget:
        return (f"this rank sent about {total:.0f} bytes ({made or 'point-to-point'}); a "
                f"reduce-scatter sends {budget:.0f}, (n-1)/n of the padded gradient: each "
                "rank needs only its own part of the sum, not every rank's whole gradient")
    if total < 0.99 * budget:
        return (f"the right shard, but this rank sent only {total:.0f} bytes "
                f"({made or 'point-to-point' if r['calls'] else 'nothing'}), where its parts "
                f"for the other ranks take {budget:.0f} ((n-1)/n of the padded gradient): "
                "every other rank needs this rank's part of the sum, sent by your function's "
                "collective")
    return None


def check_shard_gradient(fn) -> str:
    seed = new_seed()

    def judge(results: list, rank: int, n: int) -> str | None:
        for got, want in zip(results, _expected(seed, n, rank)):
            r = {**want, **got}
            problem = _shard_problem(r, rank, n) or (_cost_problem(r, n) if n > 1 else None)
            if problem:
                return f", a gradient of shape {r['shape']}: {problem}"
        return None

    each_world(_shard_trial, lambda n: (fn, _dealt(seed, n)), judge, seed,
               hang_hint="Every rank must call the same collective with tensors of the same "
                         "size.")
    return (f"every rank got its averaged shard, {TRIALS} shapes (uneven, smaller than the "
            f"world) on 1 to 4 ranks, at the cost of one reduce-scatter (seed {seed})")
