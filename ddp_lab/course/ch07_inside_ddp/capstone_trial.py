"""What the capstone's check runs on each rank: the learner's DDP next to torch's
DistributedDataParallel (``find_unused_parameters=True``) on a model that holds every trap a
from-scratch DDP falls into, on every check:

* a frozen layer (no hook may go on it; it is broadcast at construction all the same),
* a branch that some ranks use and others do not, a different set each step (its bucket must
  still be all-reduced by every rank, in the same place in the order),
* a layer no rank uses (its ``.grad`` stays None, as torch leaves it),
* a float16 ``gain`` beside the float32 weights (a bucket of its own: torch keeps one dtype
  per bucket) whose gradient is 40000 on every rank: summed over two ranks or more it
  overflows float16 (65504 at most) unless each rank divides by the world size first, as
  torch does,

and a buffer, and a different random model on every rank before construction. With buckets,
the first step starts with one rank late by a random fraction of a second: on the other
ranks nothing
in backward may wait for it (the all-reduces are asynchronous), and a ``sync_gradients()``
that sleeps instead of waiting reads sums that are not there yet. Everything the ranks
return is plain data; ``exercises_b`` turns it into a verdict.
"""

from __future__ import annotations

import copy
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from ddp_lab.course.ch07_inside_ddp.backward_trace import BackwardTrace
from ddp_lab.exercises.driver import generator

STEPS = 2  # each rank uses the branch in one step and skips it in the other
LOUD = 40000.0  # gain's gradient on every rank: 2 x 40000 > 65504, 2 x 40000 / 2 is not
BUCKET_MB = 256 / 2 ** 20  # this model in 6 buckets: 4 float32 ones, unused's, gain's


class CapstoneNet(nn.Module):
    """A small MLP with a frozen input layer, a branch, an unused layer, a buffer, and a
    float16 parameter; ``forward(x, branch)`` returns the prediction and ``gain.sum()``."""

    def __init__(self):
        super().__init__()
        self.gain = nn.Parameter(torch.ones(4, dtype=torch.float16))
        self.unused = nn.Linear(4, 4)
        self.frozen = nn.Linear(8, 8).requires_grad_(False)
        self.first = nn.Sequential(nn.Linear(8, 16), nn.Tanh())
        self.branch = nn.Linear(16, 16)
        self.last = nn.Sequential(nn.Linear(16, 16), nn.Tanh(), nn.Linear(16, 4))
        self.register_buffer("shift", torch.randn(8))

    def forward(self, x, branch: bool = True):
        h = self.first(self.frozen(x + self.shift))
        if branch:
            h = h + torch.tanh(self.branch(h))
        return self.last(h), self.gain.float().sum()


def uses_branch(rank: int, step: int) -> bool:
    """Some ranks use the branch and some do not, in every step (one rank: every other)."""
    return (rank + step) % 2 == 0


def locally_unused(step: int, rank: int) -> set[str]:
    """The trainable parameters that get no gradient on this rank in this step."""
    names = {"unused.weight", "unused.bias"}
    return names if uses_branch(rank, step) else names | {"branch.weight", "branch.bias"}


def _loss(model, x, y, branch: bool, loud: float = LOUD):
    prediction, gain = model(x, branch)
    return F.mse_loss(prediction, y) + loud * gain


def _optimizer(module: nn.Module) -> torch.optim.Optimizer:
    """SGD with momentum and weight decay: a zero gradient where torch has None moves the
    weight. The float16 gain learns slowly and without momentum, so that it (and its
    momentum buffer) stays in range."""
    rest = [p for name, p in module.named_parameters() if name != "gain"]
    gain = {"params": [module.gain], "lr": 1e-6, "momentum": 0.0, "weight_decay": 0.0}
    return torch.optim.SGD([{"params": rest}, gain], lr=0.3, momentum=0.9, weight_decay=0.01)


def _batch(seed: int, step: int, rank: int):
    return (torch.randn(5, 8, generator=generator(seed, step, rank)),
            torch.randn(5, 4, generator=generator(seed, step, rank, 1)))


def run_trial(cls, seed: int, bucket_mb, late_rank: int, late_s: float) -> dict:
    """On each rank: the learner's ``cls`` and torch's DDP side by side, as plain data."""
    rank = dist.get_rank()
    torch.manual_seed(seed % 1000 + rank)  # every rank different: construction must fix it
    model = CapstoneNet()
    theirs = DistributedDataParallel(copy.deepcopy(model), find_unused_parameters=True)
    ours = cls(model, bucket_mb=bucket_mb)
    late = rank == late_rank and bucket_mb is not None  # one rank late, bucketed, step 0
    result = {"constructed": tensor_difference(ours.module, theirs.module, buffers=True),
              "steps": [], "late_s": late_s if late else 0.0}
    optimizers = [_optimizer(ours.module), _optimizer(theirs.module)]
    for step in range(STEPS):
        result["steps"].append(_step(ours, theirs, optimizers, seed, step,
                                     late_s if late and step == 0 else 0.0))
    if bucket_mb is not None:  # accumulation: once per world size is enough
        if hasattr(ours, "no_sync"):
            result["no_sync"] = _accumulated(ours, theirs, seed)
        result["twice"] = _two_backwards(ours, theirs, seed)
    return result


def _step(ours, theirs, optimizers, seed: int, step: int, late_s: float) -> dict:
    rank = dist.get_rank()
    x, y = _batch(seed, step, rank)
    branch = uses_branch(rank, step)
    for optimizer in optimizers:
        optimizer.zero_grad(set_to_none=True)
    if late_s:
        time.sleep(late_s)  # the late rank, in the first step: the others start without it
    with BackwardTrace() as trace:
        loss = _loss(ours, x, y, branch)
        start = time.perf_counter()
        loss.backward()
        backward_end = time.perf_counter()
        ours.sync_gradients()
        sync_end = time.perf_counter()
    _loss(theirs, x, y, branch).backward()
    record = {"branch": branch, "issued": [(*i.summary(), i.in_backward) for i in trace.issued],
              "backward_s": backward_end - start, "sync_s": sync_end - backward_end,
              "grads": grad_differences(ours.module, theirs.module)}
    for optimizer in optimizers:
        optimizer.step()
    record["params"] = tensor_difference(ours.module, theirs.module)
    return record


def _accumulated(ours, theirs, seed: int) -> dict:
    """Two micro-batches, the first inside ``no_sync()``, against torch's no_sync."""
    rank = dist.get_rank()
    (xa, ya), (xb, yb) = _batch(seed, 10, rank), _batch(seed, 11, rank)
    for model in (ours.module, theirs.module):
        model.zero_grad(set_to_none=True)
    try:
        with BackwardTrace() as inside, ours.no_sync():
            _loss(ours, xa, ya, True, LOUD / 4).backward()
        _loss(ours, xb, yb, True, LOUD / 4).backward()
        ours.sync_gradients()
    except Exception as error:  # said as such: "raised" below
        return {"raised": f"{type(error).__name__}: {str(error).splitlines()[0][:200]}"}
    with theirs.no_sync():
        _loss(theirs, xa, ya, True, LOUD / 4).backward()
    _loss(theirs, xb, yb, True, LOUD / 4).backward()
    return {"raised": None, "inside": len(inside.all_reduces()),
            "grads": grad_differences(ours.module, theirs.module)}


def _two_backwards(ours, theirs, seed: int) -> dict:
    """Two backwards and no sync_gradients() between them: torch averages each one; the
    learner's DDP must do the same or raise, never answer something else. The last thing
    the trial does, since after an error the learner's DDP is in no known state."""
    rank = dist.get_rank()
    (xa, ya), (xb, yb) = _batch(seed, 20, rank), _batch(seed, 21, rank)
    for model in (ours.module, theirs.module):
        model.zero_grad(set_to_none=True)
    for x, y in ((xa, ya), (xb, yb)):
        _loss(theirs, x, y, True, LOUD / 4).backward()
    try:
        for x, y in ((xa, ya), (xb, yb)):
            _loss(ours, x, y, True, LOUD / 4).backward()
        ours.sync_gradients()
    except Exception as error:  # an error is one right answer: say which
        return {"raised": f"{type(error).__name__}: {str(error).splitlines()[0][:200]}"}
    return {"raised": None, "grads": grad_differences(ours.module, theirs.module)}


def grad_differences(mine: nn.Module, torchs: nn.Module) -> list[tuple]:
    """(name, what differs, detail) for every parameter whose ``.grad`` is not torch's:
    "none" (torch has None, yours a tensor), "missing", "overflow" (inf or nan where torch
    has numbers), "values" (the largest difference)."""
    found = []
    for (name, p), q in zip(mine.named_parameters(), torchs.parameters()):
        if q.grad is None or p.grad is None:
            if (q.grad is None) != (p.grad is None):
                found.append((name, "none" if q.grad is None else "missing", ""))
            continue
        if not torch.isfinite(p.grad).all() and torch.isfinite(q.grad).all():
            found.append((name, "overflow", str(p.grad.dtype).replace("torch.", "")))
        elif not _close(p.grad, q.grad):
            diff = (p.grad.double() - q.grad.double()).abs().max().item()
            found.append((name, "values", f"{diff:.3g}"))
    return found


def tensor_difference(mine: nn.Module, torchs: nn.Module, buffers: bool = False):
    """(name, largest difference) of the first parameter (or buffer) that is not torch's,
    or None."""
    def tensors(module):
        found = list(module.named_parameters())
        return found + (list(module.named_buffers()) if buffers else [])
    for (name, a), (_, b) in zip(tensors(mine), tensors(torchs)):
        if not _close(a.detach(), b.detach()):
            diff = (a.detach().double() - b.detach().double()).abs().max().item()
            return name, f"{diff:.3g}"
    return None


def _close(a: torch.Tensor, b: torch.Tensor) -> bool:
    try:
        torch.testing.assert_close(a, b)
    except AssertionError:
        return False
    return True
