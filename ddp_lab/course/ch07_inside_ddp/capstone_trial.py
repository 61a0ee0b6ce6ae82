"""What the capstone's check runs on the ranks: the learner's DDP in one run, torch's
DistributedDataParallel (``find_unused_parameters=True``) on the same inputs in another (the
oracle never shares a process with the learner's code, and the checker compares), on a model
that holds every trap a from-scratch DDP falls into, on every check:

* a frozen layer (no hook may go on it; it is broadcast at construction all the same),
* a branch that some ranks use and others do not, a different set each step (its bucket must
  still be all-reduced by every rank, in the same place in the order),
* a layer no rank uses (its ``.grad`` stays None, as torch leaves it),
* a float16 ``gain`` beside the float32 weights (a bucket of its own: torch keeps one dtype
  per bucket) whose gradient is 40000 on every rank: summed over two ranks or more it
  overflows float16 (65504 at most) unless each rank divides by the world size first, as
  torch does,

and a buffer, and a different random model on every rank before construction. The checker
makes every rank's inputs and deals each rank its own. The first step starts with one rank
late by a random fraction of a second: on the other ranks nothing in backward may wait for it
(the all-reduces are asynchronous), and a ``sync_gradients()`` that does not wait on its work
handles (or sleeps instead) returns before the sums are there: its gradients are read as it
returns, and again after a barrier (a change between the two says so). Everything the ranks
return is plain data; ``exercises_b`` turns it into a verdict.
"""

from __future__ import annotations

import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from ddp_lab.course.ch07_inside_ddp.backward_trace import BackwardTrace
from ddp_lab.course.ch07_inside_ddp.wait_ledger import WaitLedger
from ddp_lab.course.collective_trace import BuiltinSwitchedOff
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


# Batches by what they are for: the steps, then no_sync()'s two, then two backwards unsynced.
STEP_BATCHES, NO_SYNC_BATCHES, TWICE_BATCHES = tuple(range(STEPS)), (10, 11), (20, 21)


def dealt_inputs(seed: int, world: int) -> list[tuple[dict, dict]]:
    """In the checker: every rank's start (a different random model on every rank, which
    construction must replace with rank 0's) and its batches, by batch number."""
    inputs = []
    for rank in range(world):
        with torch.random.fork_rng():  # the checker's own RNG is left as it was
            torch.manual_seed(seed % 1000 + rank)
            state = CapstoneNet().state_dict()
        batches = {k: (torch.randn(5, 8, generator=generator(seed, k, rank)),
                       torch.randn(5, 4, generator=generator(seed, k, rank, 1)))
                   for k in STEP_BATCHES + NO_SYNC_BATCHES + TWICE_BATCHES}
        inputs.append((state, batches))
    return inputs


def _start(dealt) -> tuple[CapstoneNet, dict]:
    state, batches = dealt.take()
    model = CapstoneNet()
    model.load_state_dict(state)
    return model, batches


def run_trial(cls, dealt, bucket_mb, late_rank: int, late_s: float) -> dict:
    """On each rank: the learner's ``cls`` on this rank's own inputs (dealt: nothing of the
    expectation is here), as plain data: its state after construction, each step's
    collectives, timings, gradients and weights, and gradient accumulation."""
    model, batches = _start(dealt)
    ours = cls(model, bucket_mb=bucket_mb)
    late = late_s if dist.get_rank() == late_rank else 0.0  # one rank late, step 0
    result = {"constructed": tensors_of(ours.module, buffers=True), "steps": [],
              "late_s": late}
    optimizer = _optimizer(ours.module)
    for step in STEP_BATCHES:
        result["steps"].append(_step(ours, optimizer, batches[step], step,
                                     late if step == 0 else 0.0))
    if bucket_mb is not None:  # accumulation: once per world size is enough
        if hasattr(ours, "no_sync"):
            result["no_sync"] = _accumulated(ours, batches)
        result["twice"] = _two_backwards(ours, batches)
    return result


def _step(ours, optimizer, batch, step: int, late_s: float) -> dict:
    x, y = batch
    branch = uses_branch(dist.get_rank(), step)
    optimizer.zero_grad(set_to_none=True)
    if late_s:
        time.sleep(late_s)  # the late rank, in the first step: the others start without it
    with WaitLedger() as ledger, BackwardTrace() as trace:  # the ledger outside: it nests
        loss = _loss(ours, x, y, branch)
        start = time.perf_counter()
        loss.backward()
        backward_end = time.perf_counter()
        ours.sync_gradients()
        sync_end = time.perf_counter()
    returned = grads_of(ours.module)
    dist.barrier()  # gloo's barrier waits for every collective issued before it
    record = {"issued": [(*i.summary(), i.in_backward) for i in trace.issued],
              "backward_s": backward_end - start, "sync_s": sync_end - backward_end,
              "grads": returned, "changed_after": _changed(returned, grads_of(ours.module)),
              "unwaited": sum(not i.call.functional for i in trace.all_reduces())
              - ledger.waited}
    optimizer.step()
    record["params"] = tensors_of(ours.module)
    return record


def _accumulated(ours, batches: dict) -> dict:
    """Two micro-batches, the first inside ``no_sync()``, then one sync."""
    (xa, ya), (xb, yb) = (batches[k] for k in NO_SYNC_BATCHES)
    ours.module.zero_grad(set_to_none=True)
    try:
        with BackwardTrace() as inside, ours.no_sync():
            _loss(ours, xa, ya, True, LOUD / 4).backward()
        _loss(ours, xb, yb, True, LOUD / 4).backward()
        ours.sync_gradients()
    except BuiltinSwitchedOff:
        raise
    except Exception as error:  # said as such: "raised" below
        return {"raised": f"{type(error).__name__}: {str(error).splitlines()[0][:200]}"}
    return {"raised": None, "inside": len(inside.all_reduces()), "grads": grads_of(ours.module)}


def _two_backwards(ours, batches: dict) -> dict:
    """Two backwards and no sync_gradients() between them: torch averages each one; the
    learner's DDP must do the same or raise, never answer something else. The last thing
    the trial does, since after an error the learner's DDP is in no known state."""
    ours.module.zero_grad(set_to_none=True)
    try:
        for k in TWICE_BATCHES:
            _loss(ours, *batches[k], True, LOUD / 4).backward()
        ours.sync_gradients()
    except BuiltinSwitchedOff:
        raise
    except Exception as error:  # an error is one right answer: say which
        return {"raised": f"{type(error).__name__}: {str(error).splitlines()[0][:200]}"}
    return {"raised": None, "grads": grads_of(ours.module)}


def torchs_trial(dealt) -> dict:
    """The oracle, in ranks of its own (never where the learner's code runs): torch's
    DistributedDataParallel on the same inputs, its gradients and weights as plain data."""
    model, batches = _start(dealt)
    theirs = DistributedDataParallel(model, find_unused_parameters=True)
    optimizer, rank, result = _optimizer(theirs.module), dist.get_rank(), {"steps": []}
    for step in STEP_BATCHES:
        optimizer.zero_grad(set_to_none=True)
        _loss(theirs, *batches[step], uses_branch(rank, step)).backward()
        grads = grads_of(theirs.module)
        optimizer.step()
        result["steps"].append({"grads": grads, "params": tensors_of(theirs.module)})
    theirs.module.zero_grad(set_to_none=True)
    with theirs.no_sync():
        _loss(theirs, *batches[NO_SYNC_BATCHES[0]], True, LOUD / 4).backward()
    _loss(theirs, *batches[NO_SYNC_BATCHES[1]], True, LOUD / 4).backward()
    result["no_sync"] = grads_of(theirs.module)
    theirs.module.zero_grad(set_to_none=True)
    for k in TWICE_BATCHES:
        _loss(theirs, *batches[k], True, LOUD / 4).backward()
    result["twice"] = grads_of(theirs.module)
    return result


def grads_of(module: nn.Module) -> list[tuple[str, torch.Tensor | None]]:
    """(name, a copy of ``.grad`` or None) for every parameter, in order."""
    return [(name, None if p.grad is None else p.grad.detach().clone())
            for name, p in module.named_parameters()]


def tensors_of(module: nn.Module, buffers: bool = False) -> list[tuple[str, torch.Tensor]]:
    """(name, a copy) of every parameter (and buffer), in order."""
    found = list(module.named_parameters()) + (list(module.named_buffers()) if buffers else [])
    return [(name, t.detach().clone()) for name, t in found]


def _changed(before: list, after: list) -> str | None:
    """The first parameter whose ``.grad`` changed between two looks, or None."""
    for (name, a), (_, b) in zip(before, after):
        if (a is None) != (b is None) or (a is not None and not torch.equal(a, b)):
            return name
    return None


def grad_differences(mine: list, torchs: list) -> list[tuple]:
    """In the checker: (name, what differs, detail) for every gradient that is not torch's:
    "none" (torch has None, yours a tensor), "missing", "overflow" (inf or nan where torch
    has numbers), "values" (the largest difference)."""
    found = []
    for (name, p), (_, q) in zip(mine, torchs):
        if q is None or p is None:
            if (q is None) != (p is None):
                found.append((name, "none" if q is None else "missing", ""))
            continue
        if not torch.isfinite(p).all() and torch.isfinite(q).all():
            found.append((name, "overflow", str(p.dtype).replace("torch.", "")))
        elif not _close(p, q):
            found.append((name, "values", f"{_largest(p, q):.3g}"))
    return found


def tensor_difference(mine: list, torchs) -> tuple[str, str] | None:
    """In the checker: (name, largest difference) of the first tensor of ``mine`` that is not
    ``torchs``' of the same name (a list of pairs, or a state dict), or None."""
    theirs = dict(torchs)
    for name, a in mine:
        if not _close(a, theirs[name]):
            return name, f"{_largest(a, theirs[name]):.3g}"
    return None


def _largest(a: torch.Tensor, b: torch.Tensor) -> float:
    return (a.double() - b.double()).abs().max().item()


def _close(a: torch.Tensor, b: torch.Tensor) -> bool:
    try:
        torch.testing.assert_close(a, b)
    except AssertionError:
        return False
    return True
