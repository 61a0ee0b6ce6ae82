"""Notebook 15's exercise: DiLoCo's outer step.

After H inner steps each rank holds its own ``local`` parameters; every rank still holds the
same ``outer`` parameters (where the round started) and the same outer ``momenta``. The outer
step averages the pseudo-gradient ``outer - local`` over the ranks and takes one SGD step
with Nesterov momentum on ``outer`` (Douillard et al. 2023, https://arxiv.org/abs/2311.08105,
Algorithm 1), as ``torch.optim.SGD(nesterov=True)`` would (torch/optim/sgd.py:364-367:
``buf = momentum * buf + g``, then ``g + momentum * buf`` is the step).

The checker's process draws every rank's inputs from a fresh seed and deals each rank its own
(``local`` differs between ranks; ``outer`` and ``momenta`` are the same), the outer learning
rate and momentum at random (never 1 or 0), and compares what came back there, with the wrong
answers learners write recognised by name: the own delta only, a sum instead of a mean, no
Nesterov, the delta's sign flipped, the learning rate ignored, the momenta given ignored (a
fresh ``torch.optim.SGD``, whose first step starts its buffer at the gradient).
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from ddp_lab.exercises.driver import each_world, generator, new_seed
from ddp_lab.exercises.registry import Exercise
from ddp_lab.exercises.sealed import deal

RTOL, ATOL = 1e-5, 1e-6
SHAPES = ((5, 3), (3,), (2, 2, 2))


def diloco_outer_step(outer, local, momenta, outer_lr, momentum):
    """Reference: the pseudo-gradient (outer - local) averaged over the ranks, then SGD with
    Nesterov momentum on the outer parameters. Returns (new outer, new momenta)."""
    world = dist.get_world_size()
    new_outer, new_momenta = [], []
    for start, mine, buf in zip(outer, local, momenta):
        delta = start - mine
        dist.all_reduce(delta)
        delta /= world
        buf = momentum * buf + delta
        new_momenta.append(buf)
        new_outer.append(start - outer_lr * (delta + momentum * buf))
    return new_outer, new_momenta


def _draw(seed: int, world: int) -> dict:
    """Everything, made here: shared outer parameters and momenta, each rank's local ones."""
    g = generator(seed, world)
    outer = [torch.randn(s, generator=g) for s in SHAPES]
    momenta = [0.1 * torch.randn(s, generator=g) for s in SHAPES]
    local = [[o - 0.05 * torch.randn(o.shape, generator=generator(seed, world, r, i))
              for i, o in enumerate(outer)] for r in range(world)]
    lr = round(0.3 + 0.5 * torch.rand((), generator=g).item(), 3)
    mu = round(0.5 + 0.4 * torch.rand((), generator=g).item(), 3)
    return {"outer": outer, "momenta": momenta, "local": local, "lr": lr, "mu": mu}


def _trial(fn, dealt):
    outer, local, momenta, lr, mu = dealt.take()
    return fn([t.clone() for t in outer], local, [t.clone() for t in momenta], lr, mu)


def outer_step_by_formula(inputs: dict, mean=True, nesterov=True, sign=1.0, lr=None,
                          own=None, momenta=True) -> tuple[list, list]:
    """The outer step computed here, in one process, with one thing changed or not: the
    checker's expectation and the wrong answers it names."""
    world = len(inputs["local"])
    lr = inputs["lr"] if lr is None else lr
    ranks = [own] if own is not None else range(world)
    new_outer, new_momenta = [], []
    for i, start in enumerate(inputs["outer"]):
        delta = sum(sign * (start - inputs["local"][r][i]) for r in ranks)
        delta = delta / (len(ranks) if mean else 1)
        buf = inputs["mu"] * inputs["momenta"][i] + delta if momenta else delta
        new_momenta.append(buf)
        step = delta + inputs["mu"] * buf if nesterov else buf
        new_outer.append(start - lr * step)
    return new_outer, new_momenta


def _close(got, want) -> bool:
    return (isinstance(got, (list, tuple)) and len(got) == len(want)
            and all(isinstance(a, torch.Tensor) and a.shape == b.shape
                    and torch.allclose(a.double(), b.double(), rtol=RTOL, atol=ATOL)
                    for a, b in zip(got, want)))


WRONG = (  # (what the answer did, what is true), tried when the answer is not the right one
    ({"mean": False}, "summed the ranks' deltas without dividing by the world size: "
                      "all_reduce gives the SUM, the pseudo-gradient is its MEAN"),
    ({"nesterov": False}, "stepped along the momentum buffer alone (heavy-ball momentum): "
                          "with Nesterov the step is delta + momentum * buf, buf being "
                          "momentum * old_buf + delta"),
    ({"sign": -1.0}, "used local - outer: the pseudo-gradient is outer - local (what the inner "
                     "steps moved away from the start), and the outer step subtracts it"),
    ({"lr": 1.0}, "ignored the outer learning rate: the step is outer_lr times the Nesterov "
                  "direction"),
    ({"momenta": False}, "ignored the momenta given: a fresh torch.optim.SGD starts its buffer "
                         "at the gradient on its first step (buf = d, torch/optim/sgd.py:360-361); "
                         "set optimizer.state[p]['momentum_buffer'] = buf.clone() before step(), "
                         "or write the update"),
)


def _problem(values: list, inputs: dict) -> str | None:
    want_outer, want_momenta = outer_step_by_formula(inputs)
    for rank, value in enumerate(values):
        if not (isinstance(value, (tuple, list)) and len(value) == 2):
            return (f", rank {rank}: return (new_outer, new_momenta), two lists of tensors; "
                    f"got {type(value).__name__}")
        got_outer, got_momenta = value
        if _close(got_outer, want_outer) and _close(got_momenta, want_momenta):
            continue
        if _close(got_outer, want_outer):
            return (f", rank {rank}: the new outer parameters are right, the new momenta are "
                    "not: return buf = momentum * old_buf + mean delta, for each tensor")
        said = _named_mistake(got_outer, inputs, rank, want_outer)
        if said:
            return f", outer_lr={inputs['lr']}, momentum={inputs['mu']}: rank {rank} {said}."
        return (f", outer_lr={inputs['lr']}, momentum={inputs['mu']}: rank {rank}'s new outer "
                "parameters are not outer - outer_lr * (d + momentum * buf), with d the mean "
                "over the ranks of outer - local and buf = momentum * old_buf + d")
    return None


def _named_mistake(got_outer, inputs: dict, rank: int, want_outer: list) -> str | None:
    """What the wrong answer did, if it is one of the known mistakes (each tried only where
    it differs from the right answer: on one rank a sum is the mean)."""
    if _close(got_outer, outer_step_by_formula(inputs, own=rank)[0]):
        return ("used its own delta only: the others' local parameters reach it only by a "
                "collective (all_reduce the delta, then divide by the world size)")
    for change, said in WRONG:
        wrong = outer_step_by_formula(inputs, **change)[0]
        if _close(got_outer, wrong) and not _close(wrong, want_outer):
            return said
    return None


def check_diloco_outer_step(fn) -> str:
    seed = new_seed()
    inputs = {n: _draw(seed, n) for n in (1, 2, 3, 4)}
    each_world(_trial, lambda n: (fn, deal([(inputs[n]["outer"], inputs[n]["local"][r],
                                              inputs[n]["momenta"], inputs[n]["lr"],
                                              inputs[n]["mu"]) for r in range(n)])),
               seed=seed, judge_world=lambda values, n: _problem(values, inputs[n]))
    return ("DiLoCo's outer step (mean pseudo-gradient, Nesterov momentum, outer lr) on 1-4 "
            f"ranks (seed {seed})")


EXERCISES = (
    Exercise(
        name="15.diloco_outer_step",
        notebook="15_train_through_failures",
        summary="diloco_outer_step(outer, local, momenta, outer_lr, momentum): the outer "
                "parameters and momenta after one DiLoCo outer step, the same on every rank",
        hint="the pseudo-gradient of a round is how far the inner steps moved each parameter "
             "from where the round started, averaged over the ranks; the outer optimizer "
             "treats it as a gradient (torch.optim.SGD with nesterov=True does the rest, see "
             "its documented update, once its state holds the momenta given).",
        recipe="for each tensor: d = outer_t - local_t; dist.all_reduce(d); d /= world; "
               "buf = momentum * buf + d; new = outer_t - outer_lr * (d + momentum * buf); "
               "return the lists of new and of buf.",
        solution=diloco_outer_step,
        checker=check_diloco_outer_step,
        answered_by=("ddp_lab.course.ch15_resilience.diloco:outer_step",),
    ),
)
