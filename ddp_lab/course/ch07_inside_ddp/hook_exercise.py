"""Notebook 07's exercise: write a communication hook that averages each bucket across
the ranks, as DDP does, and counts the bytes it all-reduces in ``state["bytes"]``.

The checker runs the learner's hook on real ranks next to DDP's own all-reduce and a
model with no communication at all, on the same data, and compares the gradients after
every iteration, so a wrong answer gets a diagnosis rather than just "mismatch".
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from ddp_lab.course.params import flat_grads
from ddp_lab.course.ch07_inside_ddp.workload import MLPConfig, make_mlp

EXERCISE_MODEL = MLPConfig(inputs=16, width=64, depth=3, outputs=2)
SMALL_BUCKETS_MB = 0.01  # several buckets per iteration once they are rebuilt


def hook_versus_default(hook, iterations: int = 3) -> dict:
    """On each rank: gradients after each iteration with the learner's hook ("theirs"),
    with DDP's default ("ours") and without DDP ("local"), plus the bytes counted."""
    rank = dist.get_rank()
    theirs = DDP(make_mlp(EXERCISE_MODEL), bucket_cap_mb=SMALL_BUCKETS_MB)
    ours = DDP(make_mlp(EXERCISE_MODEL), bucket_cap_mb=SMALL_BUCKETS_MB)
    local = make_mlp(EXERCISE_MODEL)
    state = {"bytes": 0}
    theirs.register_comm_hook(state, hook)
    grads = []
    for it in range(iterations):
        x = torch.randn(8, EXERCISE_MODEL.inputs,
                        generator=torch.Generator().manual_seed(100 * it + rank))
        for model in (theirs, ours, local):
            model.zero_grad()
            model(x).square().mean().backward()
        grads.append({"theirs": flat_grads(theirs), "ours": flat_grads(ours),
                      "local": flat_grads(local)})
    return {"grads": grads, "bytes": state["bytes"],
            "expected_bytes": iterations * EXERCISE_MODEL.parameters * 4}


def _diagnose(g: dict, world: int) -> str | None:
    """None if the learner's gradients are right, else what they look like."""
    def close(a, b):
        return torch.allclose(a, b, rtol=1e-4, atol=1e-6)
    if close(g["theirs"], g["ours"]):
        return None
    if close(g["theirs"], g["ours"] * world):
        return (f"the gradients are {world}x too large: the all-reduce SUMs, so divide "
                "the bucket by the world size (before or after)")
    if close(g["theirs"], g["local"]):
        return "each rank kept its own gradient: all-reduce the bucket's buffer"
    diff = (g["theirs"] - g["ours"]).abs().max().item()
    return f"the gradients differ from DDP's average by up to {diff:.3g}"


def check_counting_hook(hook, world_sizes=(2, 3)) -> str:
    """The exercise's checker: ``hook(state, bucket)`` must return a Future of the bucket
    averaged over the ranks and add the bytes it all-reduced to ``state["bytes"]``."""
    import ddp_lab
    for n in world_sizes:
        out = ddp_lab.run(hook_versus_default, world_size=n, args=(hook,), timeout=60,
                          echo=False).values
        for rank, result in enumerate(out):
            for it, g in enumerate(result["grads"]):
                problem = _diagnose(g, n)
                if problem:
                    raise AssertionError(f"{n} ranks, rank {rank}, iteration {it}: {problem}")
            counted, expected = result["bytes"], result["expected_bytes"]
            if counted != expected:
                hint = ("it was never increased" if counted == 0 else
                        "count buffer.numel() * buffer.element_size() of every bucket")
                raise AssertionError(f"{n} ranks, rank {rank}: state['bytes'] is {counted}, "
                                     f"expected {expected} (all gradients, float32, "
                                     f"{len(result['grads'])} iterations): {hint}")
    return f"passed on {', '.join(map(str, world_sizes))} ranks"
