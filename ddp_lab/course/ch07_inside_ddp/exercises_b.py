"""The capstone (notebook 07b): write your own DDP, checked against torch's.

The learner's class is used as ``cls(module, bucket_mb=...)``: called like the module,
``.sync_gradients()`` before the optimizer step, ``.module`` the wrapped model. The checker
trains 3 steps on 1-4 ranks, each rank starting from a different random model (so the
construction must broadcast rank 0's parameters and buffers), next to torch's
DistributedDataParallel on the same data, and requires the same parameters after every
step. Meanwhile ``dist.all_reduce`` is watched: the first all-reduce of every step must be
issued while autograd is still running backward (communication overlapping computation),
and with ``bucket_mb`` there must be one all-reduce per bucket, not one per parameter.
"""

from __future__ import annotations

import contextlib
import copy
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.distributed import distributed_c10d
from torch.nn.parallel import DistributedDataParallel

from ddp_lab.exercises.builtins_off import replaced
from ddp_lab.exercises.driver import WORLD_SIZES, generator, new_seed, run_ranks
from ddp_lab.exercises.driver import where as on
from ddp_lab.exercises.registry import Exercise, ExerciseFailed
from ddp_lab.scratch.ddp import DDP

STEPS = 3
BUCKET_MB = 600 / 2 ** 20  # this model in 2 buckets, the second one not full
VARIANTS = (None, BUCKET_MB)


class ShiftedMLP(nn.Module):
    """A small MLP whose input is shifted by a buffer: a replica that skipped the buffer's
    broadcast computes something else."""

    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 16), nn.Tanh(),
                                 nn.Linear(16, 4))
        self.register_buffer("shift", torch.randn(8))

    def forward(self, x):
        return self.net(x + self.shift)


@contextlib.contextmanager
def watching_all_reduce(model: nn.Module):
    """Record, for each all_reduce the learner issues, when (time.time()), whether
    autograd's backward was still running (torch._C._current_graph_task_id() is -1 outside
    backward) and how many parameters still had no gradient."""
    calls: list[dict] = []
    original = distributed_c10d.all_reduce

    def all_reduce(*args, **kwargs):
        calls.append({"at": time.time(),
                      "in_backward": torch._C._current_graph_task_id() != -1,
                      "grads_missing": sum(p.grad is None for p in model.parameters())})
        return original(*args, **kwargs)

    with replaced(dist, "all_reduce", all_reduce), \
            replaced(distributed_c10d, "all_reduce", all_reduce):
        yield calls


def _trial(cls, seed: int, bucket_mb) -> dict:
    rank = dist.get_rank()
    torch.manual_seed(seed % 1000 + rank)  # every rank different: construction must fix it
    model = ShiftedMLP()
    theirs = DistributedDataParallel(copy.deepcopy(model))
    ours = cls(model, bucket_mb=bucket_mb)
    expected_calls = len(DDP.plan_buckets(list(model.parameters()), bucket_mb))
    optimizers = [torch.optim.SGD(m.parameters(), lr=0.5) for m in (ours.module, theirs)]
    steps = [{"calls": None, "ours": _copies(ours.module, buffers=True),
              "theirs": _copies(theirs.module, buffers=True)}]  # right after construction
    for step in range(STEPS):
        x = torch.randn(5, 8, generator=generator(seed, step, rank))
        y = torch.randn(5, 4, generator=generator(seed, step, rank, 1))
        for optimizer in optimizers:
            optimizer.zero_grad(set_to_none=True)
        with watching_all_reduce(ours.module) as calls:
            F.mse_loss(ours(x), y).backward()
            ours.sync_gradients()
        optimizers[0].step()
        F.mse_loss(theirs(x), y).backward()
        optimizers[1].step()
        steps.append({"calls": calls, "ours": _copies(ours.module),
                      "theirs": _copies(theirs.module)})
    return {"steps": steps, "expected_calls": expected_calls}


def _copies(module: nn.Module, buffers: bool = False) -> list[torch.Tensor]:
    tensors = list(module.parameters()) + (list(module.buffers()) if buffers else [])
    return [t.detach().clone() for t in tensors]


def check_your_own_ddp(cls) -> str:
    seed = new_seed()
    for n in WORLD_SIZES:
        for bucket_mb in VARIANTS:
            label = "None" if bucket_mb is None else f"{bucket_mb:.6f}"
            where = f"{on(n, seed)}, bucket_mb={label}"
            results = run_ranks(_trial, n, (cls, seed, bucket_mb), where=where, timeout=30)
            for rank, result in enumerate(results):
                _judge_construction(where, rank, result["steps"][0])
            for rank, result in enumerate(results):
                _judge_steps(where, rank, result, bucket_mb)
    return (f"the same parameters as torch's DDP after {STEPS} steps, all-reduces issued "
            f"during backward, per parameter and per bucket, on 1-4 ranks (seed {seed})")


def _judge_construction(where: str, rank: int, constructed: dict) -> None:
    k = _first_difference(constructed)
    if k is not None:
        raise ExerciseFailed(
            f"{where}, rank {rank}: right after construction, parameter or buffer {k} differs "
            "from torch's DDP (every rank starts from a different random model here). The "
            "constructor must dist.broadcast every parameter and buffer from rank 0.")


def _judge_steps(where: str, rank: int, result: dict, bucket_mb) -> None:
    for step, record in enumerate(result["steps"][1:]):
        at = f"{where}, rank {rank}, step {step}"
        _judge_calls(at, record["calls"], result["expected_calls"], bucket_mb)
        k = _first_difference(record)
        if k is not None:
            diff = (record["ours"][k] - record["theirs"][k]).abs().max().item()
            raise ExerciseFailed(
                f"{at}: after the optimizer step, parameter {k} differs from torch's DDP by "
                f"up to {diff:.3g}. The gradients must be the average over the ranks: "
                "all-reduce (SUM) every gradient, wait, then divide by the world size.")


def _first_difference(record: dict) -> int | None:
    for k, (mine, torchs) in enumerate(zip(record["ours"], record["theirs"])):
        try:
            torch.testing.assert_close(mine, torchs)
        except AssertionError:
            return k
    return None


def _judge_calls(at: str, calls: list, expected: int, bucket_mb) -> None:
    if not calls:
        raise ExerciseFailed(f"{at}: no dist.all_reduce was issued during backward and "
                             "sync_gradients(): the gradients were never averaged")
    if not calls[0]["in_backward"]:
        raise ExerciseFailed(
            f"{at}: the first all-reduce was issued after backward had ended. Register a "
            "hook on each parameter (param.register_post_accumulate_grad_hook) and launch "
            "the all-reduce there with async_op=True, so communication overlaps the rest "
            "of backward; sync_gradients() only waits.")
    if len(calls) != expected:
        what = ("one per parameter" if bucket_mb is None else
                "one per bucket: parameters in reverse order, a bucket closed once it "
                "holds bucket_mb MiB or more")
        raise ExerciseFailed(f"{at}: {len(calls)} all-reduces in this step, expected "
                             f"{expected} ({what})")


EXERCISES = (
    Exercise(
        name="07b.your_own_ddp",
        notebook="07b_capstone_your_own_ddp",
        summary="MyDDP(module, bucket_mb=None): broadcast at construction, async all-reduce "
                "from post-accumulate-grad hooks (per parameter or per bucket), "
                "sync_gradients() before the step",
        hint="__init__: dist.broadcast every parameter and buffer from rank 0, then "
             "p.register_post_accumulate_grad_hook(...) on each parameter; in the hook, "
             "dist.all_reduce(..., async_op=True) and keep the work; sync_gradients(): "
             "wait on each work and divide by the world size. ddp_lab.scratch.DDP is one "
             "answer.",
        solution=DDP,
        checker=check_your_own_ddp,
    ),
)
