"""Notebook 07's exercise: a communication hook that averages each bucket across the ranks,
as DDP does, and counts the bytes it all-reduces in ``state["bytes"]``.

The checker runs the learner's hook on real ranks next to DDP's own all-reduce and a model
with no communication at all, on random data from a fresh seed, and compares the gradients
after every iteration, so a wrong answer gets a diagnosis rather than just "mismatch".
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from ddp_lab.course.ch07_inside_ddp.workload import MLPConfig, make_mlp
from ddp_lab.course.params import flat_grads
from ddp_lab.exercises.driver import WORLD_SIZES, generator, new_seed, run_ranks
from ddp_lab.exercises.driver import where as on
from ddp_lab.exercises.registry import Exercise, ExerciseFailed

MODEL = MLPConfig(inputs=16, width=64, depth=3, outputs=2)
SMALL_BUCKETS_MB = 0.01  # several buckets per iteration once they are rebuilt
ITERATIONS = 3


def counting_hook(state, bucket):
    """Reference: count the bucket's bytes, divide by the world size, all-reduce (SUM)
    asynchronously, and hand DDP a Future of the averaged buffer."""
    buffer = bucket.buffer()
    state["bytes"] += buffer.numel() * buffer.element_size()
    buffer.div_(dist.get_world_size())
    future = dist.all_reduce(buffer, async_op=True).get_future()
    return future.then(lambda fut: fut.value()[0])


def _trial(hook, seed: int) -> dict:
    """On each rank: gradients after each iteration with the learner's hook ("theirs"),
    with DDP's default ("ours") and without DDP ("local"), plus the bytes counted."""
    rank = dist.get_rank()
    theirs = DDP(make_mlp(MODEL, seed % 1000), bucket_cap_mb=SMALL_BUCKETS_MB)
    ours = DDP(make_mlp(MODEL, seed % 1000), bucket_cap_mb=SMALL_BUCKETS_MB)
    local = make_mlp(MODEL, seed % 1000)
    state = {"bytes": 0}
    theirs.register_comm_hook(state, hook)
    grads = []
    for it in range(ITERATIONS):
        x = torch.randn(8, MODEL.inputs, generator=generator(seed, it, rank))
        for model in (theirs, ours, local):
            model.zero_grad()
            model(x).square().mean().backward()
        grads.append({"theirs": flat_grads(theirs), "ours": flat_grads(ours),
                      "local": flat_grads(local)})
    return {"grads": grads, "bytes": state["bytes"]}


def diagnose(g: dict, world: int) -> str | None:
    """None if the learner's gradients are right, else what they look like."""
    def close(a, b):
        return torch.allclose(a, b, rtol=1e-4, atol=1e-6)
    if close(g["theirs"], g["ours"]):
        return None
    if world > 1 and close(g["theirs"], g["ours"] * world):
        return (f"the gradients are {world}x too large: the all-reduce SUMs, so divide "
                "the bucket by the world size (before or after)")
    if close(g["theirs"], g["local"]):
        return "each rank kept its own gradient: all-reduce the bucket's buffer"
    diff = (g["theirs"] - g["ours"]).abs().max().item()
    return f"the gradients differ from DDP's average by up to {diff:.3g}"


def check_counting_hook(hook) -> str:
    seed = new_seed()
    expected = ITERATIONS * MODEL.parameters * 4
    for n in WORLD_SIZES:
        for rank, result in enumerate(run_ranks(_trial, n, (hook, seed), where=on(n, seed),
                                                timeout=60)):
            for it, g in enumerate(result["grads"]):
                problem = diagnose(g, n)
                if problem:
                    raise ExerciseFailed(f"{on(n, seed)}, rank {rank}, iteration {it}: "
                                         f"{problem}")
            if result["bytes"] != expected:
                hint = ("it was never increased" if result["bytes"] == 0 else
                        "count buffer.numel() * buffer.element_size() of every bucket")
                raise ExerciseFailed(
                    f"{on(n, seed)}, rank {rank}: state['bytes'] is {result['bytes']}, "
                    f"expected {expected} (every gradient, float32, {ITERATIONS} "
                    f"iterations): {hint}")
    return f"DDP's gradients and every byte counted on 1-4 ranks (seed {seed})"


EXERCISES = (
    Exercise(
        name="07.counting_hook",
        notebook="07_inside_ddp",
        summary="my_hook(state, bucket): average the bucket like DDP, counting bytes in "
                "state['bytes']",
        hint="buffer = bucket.buffer(); add numel * element_size to state['bytes']; divide "
             "by the world size; dist.all_reduce(buffer, async_op=True).get_future()"
             ".then(lambda fut: fut.value()[0]).",
        solution=counting_hook,
        checker=check_counting_hook,
    ),
)
