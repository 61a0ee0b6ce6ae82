"""Notebooks 10 and 11's exercises: the reference solutions pass, plausible wrong answers are
rejected with a message that says what to fix, and an unsolved exercise says "not solved
yet". Every check runs the function on real ranks."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
import torch.distributed.nn.functional as differentiable
import torch.nn.functional as F

import ddp_lab.exercises as ex

pytestmark = pytest.mark.timeout(240)


# 10.zero1_step: wrong answers ---------------------------------------------------------------

def no_broadcast(params, owners, local_optimizer):
    if local_optimizer is not None:
        local_optimizer.step()


def broadcast_from_rank0(params, owners, local_optimizer):
    if local_optimizer is not None:
        local_optimizer.step()
    for p in params:
        dist.broadcast(p.data, src=0)


def forgets_the_step(params, owners, local_optimizer):
    for p, owner in zip(params, owners):
        dist.broadcast(p.data, src=owner)


def reduces_again(params, owners, local_optimizer):
    for p in params:
        dist.all_reduce(p.grad)
    if local_optimizer is not None:
        local_optimizer.step()


# 10.shard_gradient: wrong answers -----------------------------------------------------------

def _padded(g):
    return F.pad(g.flatten(), (0, (-g.numel()) % dist.get_world_size()))


def sums_instead_of_averaging(g):
    flat = _padded(g)
    out = torch.empty(flat.numel() // dist.get_world_size())
    dist.reduce_scatter_tensor(out, flat)
    return out


def keeps_own_gradient(g):
    return _padded(g).chunk(dist.get_world_size())[dist.get_rank()]


def forgets_padding(g):
    world = dist.get_world_size()
    out = torch.empty(g.numel() // world)
    dist.reduce_scatter_tensor(out, g.flatten())
    return out / world


def all_reduce_then_slice(g):
    flat = _padded(g)
    dist.all_reduce(flat)
    return flat.chunk(dist.get_world_size())[dist.get_rank()] / dist.get_world_size()


# 11.row_parallel: wrong answers -------------------------------------------------------------

def partial_only(x_slice, weight_slice, bias):
    return x_slice @ weight_slice.T + bias


def bias_on_every_rank(x_slice, weight_slice, bias):
    return differentiable.all_reduce(x_slice @ weight_slice.T + bias)


def gradients_summed_again(x_slice, weight_slice, bias):
    return differentiable.all_reduce(x_slice @ weight_slice.T) + bias


def detached_sum(x_slice, weight_slice, bias):
    total = (x_slice @ weight_slice.T).detach()
    dist.all_reduce(total)
    return total + bias


def averaged(x_slice, weight_slice, bias):
    partial = x_slice @ weight_slice.T
    dist.all_reduce(partial)
    return partial / dist.get_world_size() + bias


WRONG = {
    "10.zero1_step": [(no_broadcast, "still holds its old value"),
                      (broadcast_from_rank0, "src=owners[i]"),
                      (forgets_the_step, "call local_optimizer.step()"),
                      (reduces_again, "dist.all_reduce is switched off")],
    "10.shard_gradient": [(sums_instead_of_averaging, "divide by the world size"),
                          (keeps_own_gradient, "never reduced across the ranks"),
                          (forgets_padding, "raised RuntimeError"),
                          (all_reduce_then_slice, "use dist.reduce_scatter_tensor")],
    "11.row_parallel": [(partial_only, "all-reduce (sum) it"),
                        (bias_on_every_rank, "add it once"),
                        (gradients_summed_again, "backward is the identity"),
                        (detached_sum, "no gradient reached"),
                        (averaged, "their sum")],
}
CASES = [pytest.param(name, fn, hint, id=f"{name}-{fn.__name__}")
         for name, wrong in WRONG.items() for fn, hint in wrong]


@pytest.mark.parametrize("name,fn,hint", CASES)
def test_wrong_answer_is_rejected_with_advice(name, fn, hint):
    with pytest.raises(ex.ExerciseFailed, match="seed") as failure:
        ex.check(name, fn)
    assert hint in str(failure.value)


@pytest.mark.parametrize("name", list(WRONG))
def test_reference_solution_passes(name):
    assert "passed" in ex.check(name, ex.solution(name))


def stub(params, owners, local_optimizer):
    """ZeRO-1's step."""
    raise NotImplementedError


def half_written(params, owners, local_optimizer):
    if local_optimizer is not None:
        local_optimizer.step()
    raise NotImplementedError("the broadcasts are next")


@pytest.mark.parametrize("fn", [stub, half_written])
def test_unsolved_says_not_solved_yet(fn):
    assert ex.NOT_SOLVED in ex.check("10.zero1_step", fn)


def test_the_exercises_are_registered():
    assert {"10.zero1_step", "10.shard_gradient", "11.row_parallel"} <= set(ex.names())
