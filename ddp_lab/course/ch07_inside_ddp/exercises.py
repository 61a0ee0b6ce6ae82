"""Notebook 07's exercise: a communication hook that averages each bucket across the ranks,
as DDP does, and counts the bytes it all-reduces in ``state["bytes"]``.

The checker makes the start weights and every rank's inputs from a fresh seed and deals each
rank its own; the ranks run DDP with the learner's hook and return the gradients of every
iteration. The checker compares them with DDP's average (the mean of every rank's gradient,
computed here: the model never steps, so each iteration starts from the same weights) and
with each rank's own gradient, so a wrong answer gets a diagnosis rather than just
"mismatch". It also holds the hook to what the notebook says of it:

* the bytes it counts are the bytes it all-reduces: every all-reduce is seen at the
  dispatcher (:class:`CollectiveTrace`: ``dist.all_reduce``, an imported name, a
  process-group method or a functional collective alike);
* it is asynchronous: in one iteration one rank starts a random fraction of a second late,
  and on the other ranks the Future each hook call returns must still be pending when the
  hook returns (the all-reduce cannot have finished without the late rank). A hook that
  waits (``async_op=False``, ``work.wait()``, a sleep, ``set_result`` on a finished sum)
  returns a completed Future, and DDP's backward cannot go on computing meanwhile.
"""

from __future__ import annotations

import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from ddp_lab.exercises.answers_in_a_rank import plain
from ddp_lab.course.collective_trace import CollectiveTrace
from ddp_lab.course.models import MLPConfig, make_mlp
from ddp_lab.course.params import flat_grads
from ddp_lab.exercises.driver import WORLD_SIZES, each_world, generator, new_seed
from ddp_lab.exercises.driver import where as on
from ddp_lab.exercises.registry import Exercise, ExerciseFailed
from ddp_lab.exercises.sealed import deal

MODEL = MLPConfig(inputs=16, width=64, depth=3, outputs=2)
SMALL_BUCKETS_MB = 0.01  # several buckets per iteration once they are rebuilt
ITERATIONS = 3
# One rank late in the last iteration: after DDP rebuilt its buckets (several hook calls),
# and after the rebuild's broadcast in iteration 1's forward, which would absorb the delay.
LATE_ITERATION = ITERATIONS - 1


def counting_hook(state, bucket):
    """Reference: count the bucket's bytes, divide by the world size, all-reduce (SUM)
    asynchronously, and hand DDP a Future of the averaged buffer."""
    buffer = bucket.buffer()
    state["bytes"] += buffer.numel() * buffer.element_size()
    buffer.div_(dist.get_world_size())
    future = dist.all_reduce(buffer, async_op=True).get_future()
    return future.then(lambda fut: fut.value()[0])


def _watched(hook, returns: list):
    """The learner's hook, noting whether each Future it returns is already complete
    (``Work.get_future()`` gives a ``torch._C.Future``, the base of torch.futures.Future;
    its own ``done``, not one a subclass may override)."""
    def watched(state, bucket):
        future = hook(state, bucket)
        returns.append(torch._C.Future.done(future) if isinstance(future, torch._C.Future)
                       else None)
        return future
    return watched


def _trial(hook, dealt, late_rank: int, late_s: float) -> dict:
    """On each rank: its own start weights and inputs (dealt; nothing else of the check is
    here), the gradients after each iteration with the learner's hook, the bytes it counted
    and sent, and whether its Futures were complete on return in the late iteration."""
    rank = dist.get_rank()
    state, inputs = dealt.take()
    model = make_mlp(MODEL)
    model.load_state_dict(state)
    theirs = DDP(model, bucket_cap_mb=SMALL_BUCKETS_MB)
    counted, returns, sent = {"bytes": 0}, [], 0
    theirs.register_comm_hook(counted, _watched(hook, returns))
    grads, late_returns = [], []
    for it, x in enumerate(inputs):
        if it == LATE_ITERATION and rank == late_rank and late_s:
            time.sleep(late_s)  # the others' all-reduces cannot finish before this rank's
        start = len(returns)
        with CollectiveTrace() as trace:
            theirs.zero_grad()
            theirs(x).square().mean().backward()
        sent += sum(call.nbytes for call in trace.of("all_reduce"))
        if it == LATE_ITERATION:
            late_returns = returns[start:]
        grads.append(flat_grads(theirs))
    return {"grads": grads, "bytes": plain(counted["bytes"]), "sent": sent,
            "late_returns": late_returns}


def local_grads(state: dict, x: torch.Tensor) -> torch.Tensor:
    """In the checker: one rank's gradient without DDP (the model never steps, so every
    iteration starts from ``state``)."""
    model = make_mlp(MODEL)
    model.load_state_dict(state)
    model(x).square().mean().backward()
    return flat_grads(model)


def diagnose(theirs: torch.Tensor, ours: torch.Tensor, local: torch.Tensor,
             world: int) -> str | None:
    """None if the learner's gradients are DDP's average (``ours``), else what they look
    like."""
    def close(a, b):
        return isinstance(a, torch.Tensor) and a.shape == b.shape and \
            torch.allclose(a, b, rtol=1e-4, atol=1e-6)
    if close(theirs, ours):
        return None
    if world > 1 and close(theirs, ours * world):
        return (f"the gradients are {world}x too large: the all-reduce SUMs, so divide "
                "the bucket by the world size (before or after)")
    if close(theirs, local):
        return "each rank kept its own gradient: all-reduce the bucket's buffer"
    diff = (theirs - ours).abs().max().item()
    return f"the gradients differ from DDP's average by up to {diff:.3g}"


def check_counting_hook(hook) -> str:
    seed = new_seed()
    with torch.random.fork_rng():  # the check's own weights; the caller's RNG untouched
        state = make_mlp(MODEL, seed % 1000).state_dict()
    inputs = {n: [[torch.randn(8, MODEL.inputs, generator=generator(seed, it, rank))
                   for it in range(ITERATIONS)] for rank in range(n)] for n in WORLD_SIZES}
    local = {n: [[local_grads(state, x) for x in mine] for mine in inputs[n]]
             for n in WORLD_SIZES}
    expected = ITERATIONS * MODEL.parameters * 4
    lateness = {n: (seed % n, 0.5 + seed % 300 / 1000 if n > 1 else 0.0) for n in WORLD_SIZES}

    def judge_world(results: list, n: int) -> None:
        """A hook that waited is said first, on any rank: its gradients may be wrong too
        (read before its all-reduce finished), and the wait is the mistake."""
        late_rank, late_s = lateness[n]
        for rank, result in enumerate(results):
            if rank != late_rank:
                _judge_returns(on(n, seed), rank, result["late_returns"], late_rank, late_s)

    def judge(result: dict, rank: int, n: int) -> str | None:
        for it, theirs in enumerate(result["grads"]):
            ours = torch.stack([local[n][r][it] for r in range(n)]).mean(0)
            problem = diagnose(theirs, ours, local[n][rank][it], n)
            if problem:
                return f", iteration {it}: {problem}"
        _judge_bytes(on(n, seed), rank, result, expected)
        return None

    each_world(_trial, lambda n: (hook, deal([(state, mine) for mine in inputs[n]]),
                                  *lateness[n]), judge, seed, timeout=15,
               judge_world=judge_world)
    return (f"DDP's gradients, every byte counted and sent, the Future returned before the "
            f"all-reduce finished, on 1-4 ranks (seed {seed})")


def _judge_bytes(at: str, rank: int, result: dict, expected: int) -> None:
    if result["bytes"] != expected:
        hint = ("it was never increased" if result["bytes"] == 0 else
                "count buffer.numel() * buffer.element_size() of every bucket")
        raise ExerciseFailed(
            f"{at}, rank {rank}: state['bytes'] is {result['bytes']}, expected {expected} "
            f"(every gradient, float32, {ITERATIONS} iterations): {hint}")
    if result["sent"] == 0:
        raise ExerciseFailed(
            f"{at}, rank {rank}: your hook issued no all-reduce: each rank kept its own "
            "gradient (on one rank that is the average, on more it is not). All-reduce the "
            "bucket's buffer.")
    if result["sent"] != expected:
        raise ExerciseFailed(
            f"{at}, rank {rank}: your hook all-reduced {result['sent']} bytes in "
            f"{ITERATIONS} iterations but counted {expected}: the gradients hold {expected}. "
            "All-reduce each bucket's buffer once, in its own dtype.")


def _judge_returns(at: str, rank: int, returns: list, late_rank: int, late_s: float) -> None:
    if None in returns:
        raise ExerciseFailed(f"{at}, rank {rank}: your hook returned something other than a "
                             "torch.futures.Future: return the Future of the averaged buffer")
    if any(returns):
        raise ExerciseFailed(
            f"{at}, rank {rank}, iteration {LATE_ITERATION}: the Future your hook returned was "
            f"already complete when the hook returned, while rank {late_rank} was still "
            f"{late_s:.2f} s late: the hook waited for the all-reduce (async_op=False, "
            "work.wait(), a sleep, or a Future set by hand). Return the Work's Future "
            "(get_future(), then .then(...) to pick the tensor) without waiting, so that "
            "backward goes on while the bucket travels.")


EXERCISES = (
    Exercise(
        name="07.counting_hook",
        notebook="07_inside_ddp",
        summary="my_hook(state, bucket): average the bucket like DDP, counting bytes in "
                "state['bytes']",
        hint="bucket.buffer() is the flat tensor of the bucket's gradients. Count its bytes, "
             "average it over the ranks without waiting for the result, and return a "
             "torch.futures.Future whose value is the averaged tensor: a Work handle gives "
             "you a Future, and a Future's then() turns its value into another one.",
        recipe="1. buffer = bucket.buffer(); state['bytes'] += buffer.numel() * "
               "buffer.element_size().\n2. buffer.div_(dist.get_world_size()).\n"
               "3. work = dist.all_reduce(buffer, async_op=True) (never wait on it here).\n"
               "4. return work.get_future().then(lambda fut: fut.value()[0]): the "
               "all-reduce's Future holds a list of tensors; DDP wants the tensor.",
        solution=counting_hook,
        checker=check_counting_hook,
    ),
)
