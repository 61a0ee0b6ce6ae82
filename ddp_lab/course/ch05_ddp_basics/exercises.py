"""Notebook 05's exercise: what DDP does to the gradients, by hand after backward.

The checker's process makes a random MLP (a fresh seed per check; on every check one layer
frozen and one never used, so some parameters have no gradient) and every rank's random
batch. Each rank gets the model and only its own batch (``sealed.deal``), takes it through
forward and backward WITHOUT DDP, and calls the learner's function, with DDP's constructor
switched off. What DDP would leave, the mean of the ranks' gradients (None where no rank has
one), is computed in the checker's process from the same batches, out of the ranks' reach;
every rank's gradients must equal it (up to float rounding: the all-reduce adds in its own
order). The model's parameters must be left as they were.
"""

from __future__ import annotations

import copy

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from ddp_lab.course.collective_trace import CollectiveTrace
from ddp_lab.exercises.builtins_off import refusing, replaced
from ddp_lab.exercises.driver import (WORLD_SIZES, describe, each_world, generator, new_seed,
                                      tensor_problem)
from ddp_lab.exercises.driver import where as on
from ddp_lab.exercises.registry import Exercise, ExerciseFailed
from ddp_lab.exercises.sealed import deal


def average_gradients(model: nn.Module) -> None:
    """Reference: one all_reduce (sum) per gradient, divided by the world size: the mean
    of the ranks' gradients, what DDP leaves in ``.grad`` (its buckets do the same with
    fewer, larger all-reduces). Frozen parameters have no gradient and are skipped."""
    world = dist.get_world_size()
    for parameter in model.parameters():
        if parameter.grad is not None:
            dist.all_reduce(parameter.grad)
            parameter.grad /= world


class RandomNet(nn.Module):
    """The same MLP on every rank: random widths, weights from the check's seed, and on
    EVERY check one frozen layer (``requires_grad=False``: which one, the check's seed number
    decides) and one layer that forward never uses. Both leave ``.grad`` None on every rank, and DDP
    (``find_unused_parameters=True``) leaves them None too."""

    def __init__(self, seed: int):
        super().__init__()
        g = generator(seed)
        widths = [int(w) for w in torch.randint(2, 9, (3,), generator=g)]
        self.layers = nn.Sequential(nn.Linear(widths[0], widths[1]), nn.Tanh(),
                                    nn.Linear(widths[1], widths[2]), nn.Tanh(),
                                    nn.Linear(widths[2], 1))
        self.unused = nn.Linear(widths[1], 2)  # a head this forward never calls
        with torch.no_grad():
            for parameter in self.parameters():
                parameter.copy_(torch.randn(parameter.shape, generator=g))
        self.layers[2 * (seed % 3)].requires_grad_(False)
        self.in_features = widths[0]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layers(x)


def random_model(seed: int) -> nn.Module:
    return RandomNet(seed)


def batches(seed: int, world: int, inputs: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Every rank's own batch (inputs, targets), made in the checker's process."""
    found = []
    for rank in range(world):
        g = generator(seed, rank)
        x = torch.randn(int(torch.randint(1, 6, (1,), generator=g)), inputs, generator=g)
        found.append((x, torch.randn(x.shape[0], 1, generator=g)))
    return found


def _backward(model: nn.Module, batch: tuple) -> None:
    x, target = batch
    F.mse_loss(model(x), target).backward()


def rank_gradients(model: nn.Module, rank_batches: list) -> list[list]:
    """Each rank's gradients of its own batch, computed in the checker's process."""
    per_rank = []
    for batch in rank_batches:
        replica = copy.deepcopy(model)
        _backward(replica, batch)
        per_rank.append([p.grad for p in replica.parameters()])
    return per_rank


def mean_gradients(per_rank: list[list]) -> list:
    """What DDP leaves in each ``.grad``: the mean of the ranks' gradients; None where no
    rank has a gradient (a frozen parameter, or one that forward never uses: DDP with
    ``find_unused_parameters=True`` leaves those None too)."""
    return [None if grads[0] is None else torch.stack(grads).mean(dim=0)
            for grads in zip(*per_rank)]


def _trial(fn, model: nn.Module, dealt):
    """On a rank: backward on its own batch only, then the learner's averaging; returns the
    gradients it left and whether the parameters stayed as they were."""
    _backward(model, dealt.take())
    before = [p.detach().clone() for p in model.parameters()]
    with replaced(DDP, "__init__", refusing("DistributedDataParallel", "average the "
                                            "gradients yourself, after backward")), \
            CollectiveTrace() as trace:
        _call(fn, model)
    moved = sum(call.whole_nbytes for call in trace.moving_data())
    return ([p.grad for p in model.parameters()],
            all(torch.equal(b, p.detach()) for b, p in zip(before, model.parameters())), moved)


def _call(fn, model: nn.Module) -> None:
    """``fn(model)``; an error about None says which parameters have no gradient, and why."""
    try:
        fn(model)
    except (AttributeError, TypeError, ValueError, RuntimeError) as err:
        if "None" not in str(err):
            raise
        missing = [name for name, p in model.named_parameters() if p.grad is None]
        said = " ".join(str(err).split())  # torch's message on one line, so it is shown whole
        raise type(err)(f"{said} (These parameters have .grad None: {missing}. A frozen "
                        "parameter (requires_grad=False) and one that forward did not use "
                        "get no gradient; DDP leaves them alone, and so should you.)") from err


def check_average_gradients(fn) -> str:
    seed = new_seed()
    model = random_model(seed)
    dealt = {n: batches(seed, n, model.in_features) for n in WORLD_SIZES}
    own = {n: rank_gradients(model, dealt[n]) for n in WORLD_SIZES}
    expected = {n: mean_gradients(own[n]) for n in WORLD_SIZES}

    def judge(value: tuple, rank: int, n: int) -> None:
        grads, untouched, moved = value
        where = f"{on(n, seed)}, rank {rank}"
        _judge(grads, untouched, expected[n], where, own[n][rank] if n > 1 else None)
        _check_moved(moved, expected[n], n, where)

    each_world(_trial, lambda n: (fn, model, deal(dealt[n])), judge, seed,
               hang_hint="Every rank must all-reduce the same gradients in the same order.")
    return f"the same gradients as DDP (the ranks' mean) on 1-4 ranks (seed {seed})"


def _judge(got: list, untouched: bool, want: list, where: str, own=None) -> None:
    """``own``: this rank's gradients of its own batch (on several ranks), to say so when
    they came back unchanged."""
    if not untouched:
        raise ExerciseFailed(f"{where}: the parameters changed. Average the gradients "
                             "(p.grad), leave the parameters (p.data) to the optimizer.")
    if own is not None and _same_gradients(got, own) and not _same_gradients(got, want):
        raise ExerciseFailed(
            f"{where}: your gradients are this rank's own, unchanged: nothing of the other "
            "ranks reached them. DDP leaves the MEAN of the ranks' gradients: sum each "
            ".grad with all_reduce (in place, or copy the result back), divide by "
            "world_size.")
    for i, (mine, theirs) in enumerate(zip(got, want)):
        if theirs is None or mine is None:
            if mine is not theirs:
                raise ExerciseFailed(f"{where}, parameter [{i}]: DDP's gradient is "
                                     f"{describe(theirs)}, yours {describe(mine)}. A frozen "
                                     "or unused parameter has no gradient.")
        elif problem := tensor_problem(mine, theirs, exact=False):
            ratio = (mine.norm() / theirs.norm()).item() if theirs.norm() > 0 else float("nan")
            raise ExerciseFailed(
                f"{where}, parameter [{i}]: your gradient differs from DDP's (the mean of the "
                f"ranks' gradients): {problem}; norm "
                f"ratio {ratio:.3g}. DDP leaves the MEAN of the ranks' gradients: sum with "
                "all_reduce, divide by world_size, for every parameter that has a gradient.")


def _same_gradients(got: list, want: list) -> bool:
    return all(isinstance(a, torch.Tensor) and a.shape == b.shape
               and torch.allclose(a, b, rtol=1e-5, atol=1e-6) if b is not None else a is None
               for a, b in zip(got, want))


def _check_moved(moved: int, want: list, n: int, where: str) -> None:
    """On several ranks every gradient must reach the other ranks through collectives: the
    mean needs each rank's values, which only that rank has (its own batch)."""
    needed = sum(g.numel() * g.element_size() for g in want if g is not None)
    if n > 1 and moved < needed:
        raise ExerciseFailed(
            f"{where}: your collectives moved {moved} bytes, and the gradients are {needed} "
            "bytes: each rank's gradients come from its own batch, which only it has, so "
            "all of them must go through a collective (all_reduce each .grad, or one "
            "flattened tensor of them).")


EXERCISES = (
    Exercise(
        name="05.average_gradients",
        notebook="05_ddp_basics",
        summary="my_average_gradients(model): after backward without DDP, leave in every "
                ".grad what DDP would: the mean over the ranks",
        hint="DDP leaves in .grad the mean of the ranks' gradients: one collective per "
             "gradient gives every rank the sum, and the mean follows from it. Some "
             "parameters have no gradient at all (frozen, or unused in forward).",
        recipe="for p in model.parameters(): skip it if p.grad is None; else "
               "dist.all_reduce(p.grad) (a SUM, in place) and p.grad /= "
               "dist.get_world_size(). ReduceOp.AVG (gloo: a sum, then a division) does both "
               "in one call.",
        solution=average_gradients,
        checker=check_average_gradients,
    ),
)
