"""Wrong answers to notebook 15's exercise (15.diloco_outer_step), the ones a learner really
writes, and right answers written differently from the reference.

MUTANTS holds (exercise, wrong answer, a regex the rejection must match); RIGHT holds
(exercise, answer) pairs that must pass. test_mutations.py checks both. Data and functions
only, no test here."""

from __future__ import annotations

import torch
import torch.distributed as dist

NAME = "15.diloco_outer_step"


def _step(outer, local, momenta, outer_lr, momentum, *, divide=True, share=True,
          nesterov=True, sign=1.0, use_lr=True):
    new_outer, new_momenta = [], []
    for start, mine, buf in zip(outer, local, momenta):
        delta = sign * (start - mine)
        if share:
            dist.all_reduce(delta)
            if divide:
                delta /= dist.get_world_size()
        buf = momentum * buf + delta
        step = delta + momentum * buf if nesterov else buf
        new_outer.append(start - (outer_lr if use_lr else 1.0) * step)
        new_momenta.append(buf)
    return new_outer, new_momenta


def own_delta_only(outer, local, momenta, outer_lr, momentum):
    return _step(outer, local, momenta, outer_lr, momentum, share=False)


def summed_not_averaged(outer, local, momenta, outer_lr, momentum):
    return _step(outer, local, momenta, outer_lr, momentum, divide=False)


def heavy_ball_not_nesterov(outer, local, momenta, outer_lr, momentum):
    return _step(outer, local, momenta, outer_lr, momentum, nesterov=False)


def delta_sign_flipped(outer, local, momenta, outer_lr, momentum):
    return _step(outer, local, momenta, outer_lr, momentum, sign=-1.0)


def outer_lr_ignored(outer, local, momenta, outer_lr, momentum):
    return _step(outer, local, momenta, outer_lr, momentum, use_lr=False)


def old_momenta_returned(outer, local, momenta, outer_lr, momentum):
    new_outer, _ = _step(outer, local, momenta, outer_lr, momentum)
    return new_outer, momenta


def fresh_torch_sgd(outer, local, momenta, outer_lr, momentum):
    """torch's SGD with Nesterov on the mean delta, but a fresh one: the momenta passed in
    never reach it (its first step sets buf = grad)."""
    params = [torch.nn.Parameter(o.clone()) for o in outer]
    sgd = torch.optim.SGD(params, lr=outer_lr, momentum=momentum, nesterov=True)
    for p, o, mine in zip(params, outer, local):
        delta = o - mine
        dist.all_reduce(delta)
        p.grad = delta / dist.get_world_size()
    sgd.step()
    return [p.detach() for p in params], [sgd.state[p]["momentum_buffer"] for p in params]


def local_parameters_averaged(outer, local, momenta, outer_lr, momentum):
    """LocalSGD's averaging instead of the outer step: the mean of the local parameters."""
    averaged = []
    for mine in local:
        mean = mine.clone()
        dist.all_reduce(mean)
        averaged.append(mean / dist.get_world_size())
    return averaged, momenta


MUTANTS = [
    (NAME, own_delta_only, "used its own delta only"),
    (NAME, summed_not_averaged, "without dividing by the world size"),
    (NAME, heavy_ball_not_nesterov, "with Nesterov the step is delta"),
    (NAME, delta_sign_flipped, "the pseudo-gradient is outer - local"),
    (NAME, outer_lr_ignored, "ignored the outer learning rate"),
    (NAME, old_momenta_returned, "the new momenta are not"),
    (NAME, fresh_torch_sgd, r"ignored the momenta given: a fresh torch\.optim\.SGD"),
    (NAME, local_parameters_averaged, r"not outer - outer_lr \* \(d \+ momentum \* buf\)"),
]


def with_torch_sgd(outer, local, momenta, outer_lr, momentum):
    """torch's SGD with Nesterov does the update: the mean delta as the outer gradient."""
    params = [torch.nn.Parameter(o.clone()) for o in outer]
    sgd = torch.optim.SGD(params, lr=outer_lr, momentum=momentum, nesterov=True)
    for p, o, mine, buf in zip(params, outer, local, momenta):
        delta = o - mine
        dist.all_reduce(delta, op=dist.ReduceOp.AVG) if dist.get_backend() != "gloo" else \
            dist.all_reduce(delta)
        p.grad = delta if dist.get_backend() != "gloo" else delta / dist.get_world_size()
        sgd.state[p]["momentum_buffer"] = buf.clone()
    sgd.step()
    return [p.detach() for p in params], [sgd.state[p]["momentum_buffer"] for p in params]


def with_one_flat_buffer(outer, local, momenta, outer_lr, momentum):
    """One all-reduce of every delta concatenated, the update written with in-place ops."""
    flat = torch.cat([(o - m).flatten() for o, m in zip(outer, local)])
    dist.all_reduce(flat)
    flat.div_(dist.get_world_size())
    deltas = flat.split([o.numel() for o in outer])
    new_momenta = [b.mul(momentum).add_(d.view_as(b)) for b, d in zip(momenta, deltas)]
    new_outer = [o.sub(d.view_as(o) + momentum * b, alpha=outer_lr)
                 for o, d, b in zip(outer, deltas, new_momenta)]
    return new_outer, new_momenta


RIGHT = [(NAME, with_torch_sgd), (NAME, with_one_flat_buffer)]
