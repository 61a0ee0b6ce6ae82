"""Wrong answers to the exercises of notebooks 10 and 11: the ones a learner really writes.

MUTANTS holds (exercise, wrong answer, a regex the rejection must match); test_mutations.py
checks every one with a single parametrized test. Data and functions only, no test here."""

from __future__ import annotations

import os
import pickle
import re
import sys
import tempfile
import threading
import warnings
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as fc
import torch.distributed.nn.functional as differentiable
import torch.nn.functional as F
from torch.distributed import all_gather_into_tensor as imported_all_gather_into_tensor
from torch.distributed import all_gather_single as imported_all_gather_single
from torch.distributed import all_reduce as imported_all_reduce
from torch.distributed import broadcast as imported_broadcast
from torch.distributed import reduce_scatter_single as imported_reduce_scatter_single
from torch.distributed import reduce_scatter_tensor as imported_reduce_scatter_tensor
from torch.distributed.distributed_c10d import _get_default_group, _get_default_store


def _group():
    return _get_default_group()


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
        if p.grad is not None:
            dist.all_reduce(p.grad)
    if local_optimizer is not None:
        local_optimizer.step()


def _broadcast_all(params, owners):
    for p, owner in zip(params, owners):
        dist.broadcast(p.data, src=owner)


def steps_without_asking(params, owners, local_optimizer):
    local_optimizer.step()  # a rank that owns nothing has None here
    _broadcast_all(params, owners)


def reduces_with_an_imported_name(params, owners, local_optimizer):
    for p in params:
        if p.grad is not None:
            imported_all_reduce(p.grad)
    if local_optimizer is not None:
        local_optimizer.step()
    _broadcast_all(params, owners)


def reduces_with_the_group_method(params, owners, local_optimizer):
    for p in params:
        if p.grad is not None:
            _group().allreduce([p.grad]).wait()
    if local_optimizer is not None:
        local_optimizer.step()
    _broadcast_all(params, owners)


def reduces_with_a_functional_collective(params, owners, local_optimizer):
    for p in params:
        if p.grad is not None:
            p.grad = fc.all_reduce(p.grad, "sum", dist.group.WORLD) / dist.get_world_size()
    if local_optimizer is not None:
        local_optimizer.step()
    _broadcast_all(params, owners)


def gathers_every_copy(params, owners, local_optimizer):
    if local_optimizer is not None:
        local_optimizer.step()
    copies = [None] * dist.get_world_size()
    dist.all_gather_object(copies, [p.detach() for p in params])
    for k, (p, owner) in enumerate(zip(params, owners)):
        p.data.copy_(copies[owner][k])


def broadcasts_in_bfloat16(params, owners, local_optimizer):
    if local_optimizer is not None:
        local_optimizer.step()
    for p, owner in zip(params, owners):
        half = p.data.to(torch.bfloat16)
        dist.broadcast(half, src=owner)
        p.data.copy_(half)


_FULL_OPTIMIZERS = {}


def keeps_a_full_optimizer(params, owners, local_optimizer):
    """Every rank steps every parameter with an Adam of its own: right values, no
    communication, and the whole optimizer state on every rank (what ZeRO-1 removes)."""
    key = tuple(id(p) for p in params)
    if key not in _FULL_OPTIMIZERS:
        _FULL_OPTIMIZERS[key] = torch.optim.Adam(params, lr=0.1)
    _FULL_OPTIMIZERS[key].step()


def only_owners_broadcast(params, owners, local_optimizer):
    if local_optimizer is not None:
        local_optimizer.step()
    for p, owner in zip(params, owners):
        if dist.get_rank() == owner:
            dist.broadcast(p.data, src=owner)


def reduces_to_every_rank(params, owners, local_optimizer):
    """Zeros where a rank does not own, then one reduce per destination: the right values,
    each parameter sent n times."""
    if local_optimizer is not None:
        local_optimizer.step()
    rank = dist.get_rank()
    for p, owner in zip(params, owners):
        mine = p.data.clone() if rank == owner else torch.zeros_like(p.data)
        for dst in range(dist.get_world_size()):
            total = mine.clone()
            dist.reduce(total, dst=dst)
            if dst == rank:
                p.data.copy_(total)


# 10.zero1_step: right answers that differ from the reference --------------------------------

def broadcasts_as_a_functional_collective(params, owners, local_optimizer):
    if local_optimizer is not None:
        local_optimizer.step()
    for p, owner in zip(params, owners):
        p.data.copy_(fc.broadcast(p.data, owner, dist.group.WORLD))


def broadcasts_with_an_imported_name(params, owners, local_optimizer):
    if local_optimizer is not None:
        local_optimizer.step()
    for p, owner in zip(params, owners):
        imported_broadcast(p.data, src=owner)


def broadcasts_with_the_group_method(params, owners, local_optimizer):
    if local_optimizer is not None:
        local_optimizer.step()
    for p, owner in zip(params, owners):
        _group().broadcast(p.data, owner).wait()


def broadcasts_asynchronously_skipping_the_untouched(params, owners, local_optimizer):
    if local_optimizer is not None:
        local_optimizer.step()
    works = [dist.broadcast(p.data, src=owner, async_op=True)
             for p, owner in zip(params, owners) if p.grad is not None]
    for work in works:
        work.wait()


# 10.shard_gradient: wrong answers -----------------------------------------------------------

def _padded(g):
    return F.pad(g.flatten(), (0, (-g.numel()) % dist.get_world_size()))


def sums_instead_of_averaging(g):
    flat = _padded(g)
    out = torch.empty(flat.numel() // dist.get_world_size())
    dist.reduce_scatter_single(out, flat)
    return out


def keeps_own_gradient(g):
    return _padded(g).chunk(dist.get_world_size())[dist.get_rank()]


def forgets_padding(g):
    world = dist.get_world_size()
    out = torch.empty(g.numel() // world)
    dist.reduce_scatter_single(out, g.flatten())
    return out / world


def all_reduce_then_slice(g):
    flat = _padded(g)
    dist.all_reduce(flat)
    return flat.chunk(dist.get_world_size())[dist.get_rank()] / dist.get_world_size()


def _mine(total):
    world = dist.get_world_size()
    return total.chunk(world)[dist.get_rank()] / world


def broadcasts_every_gradient(g):
    flat, total = _padded(g), torch.zeros_like(_padded(g))
    for src in range(dist.get_world_size()):
        theirs = flat.clone()
        dist.broadcast(theirs, src=src)
        total += theirs
    return _mine(total)


def sends_the_whole_gradient_everywhere(g):
    flat, rank, world = _padded(g), dist.get_rank(), dist.get_world_size()
    others = [r for r in range(world) if r != rank]
    inbox = {r: torch.empty_like(flat) for r in others}
    works = [dist.isend(flat, dst=r) for r in others] + [dist.irecv(inbox[r], src=r) for r in others]
    for work in works:
        work.wait()
    return _mine(flat + sum(inbox.values(), torch.zeros_like(flat)))


def all_to_all_of_whole_copies(g):
    flat, world = _padded(g), dist.get_world_size()
    inbox = [torch.empty_like(flat) for _ in range(world)]
    dist.all_to_all(inbox, [flat.clone() for _ in range(world)])
    return _mine(torch.stack(inbox).sum(0))


def gathers_then_scatters(g):
    flat, world = _padded(g), dist.get_world_size()
    parts = [torch.empty_like(flat) for _ in range(world)] if dist.get_rank() == 0 else None
    dist.gather(flat, parts, dst=0)
    shard = torch.empty(flat.numel() // world)
    chunks = list(torch.stack(parts).sum(0).chunk(world)) if parts else None
    dist.scatter(shard, chunks, src=0)
    return shard / world


def all_reduce_with_an_imported_name(g):
    flat = _padded(g)
    imported_all_reduce(flat)
    return _mine(flat)


def all_reduce_with_the_group_method(g):
    flat = _padded(g)
    _group().allreduce([flat]).wait()
    return _mine(flat)


def all_reduce_as_a_functional_collective(g):
    return _mine(fc.all_reduce(_padded(g), "sum", dist.group.WORLD))


def all_gather_with_an_imported_name(g):
    flat, world = _padded(g), dist.get_world_size()
    every = torch.empty(world * flat.numel())
    imported_all_gather_into_tensor(every, flat)
    return _mine(every.view(world, -1).sum(0))


def all_gather_single_with_an_imported_name(g):
    flat, world = _padded(g), dist.get_world_size()
    every = torch.empty(world * flat.numel())
    imported_all_gather_single(every, flat)
    return _mine(every.view(world, -1).sum(0))


def reduce_scatters_the_wrong_half(g):
    """The right collective on a flat gradient split the wrong way: each rank's part r is
    taken from the gradient reversed, so every value of the shard is someone else's."""
    flat = _padded(g).flip(0)
    shard = _empty_shard(flat)
    dist.reduce_scatter_single(shard, flat)
    return shard / dist.get_world_size()


def all_gather_through_distributed_c10d(g):
    flat, world = _padded(g), dist.get_world_size()
    every = [torch.empty_like(flat) for _ in range(world)]
    dist.distributed_c10d.all_gather(every, flat)
    return _mine(torch.stack(every).sum(0))


def reduce_scatters_in_half_precision(g):
    flat = _padded(g).half()
    shard = torch.empty(flat.numel() // dist.get_world_size(), dtype=torch.float16)
    dist.reduce_scatter_single(shard, flat)
    return shard.float() / dist.get_world_size()


def sends_from_each_owner(params, owners, local_optimizer):
    if local_optimizer is not None:
        local_optimizer.step()
    rank, world, works = dist.get_rank(), dist.get_world_size(), []
    for p, owner in zip(params, owners):
        if rank == owner:
            works += [dist.isend(p.data, dst=r) for r in range(world) if r != owner]
        else:
            works.append(dist.irecv(p.data, src=owner))
    for work in works:
        work.wait()


# 10.shard_gradient: right answers that differ from the reference ----------------------------

def exchanges_the_parts_directly(g):
    flat, rank, world = _padded(g), dist.get_rank(), dist.get_world_size()
    parts = flat.chunk(world)
    inbox = [parts[rank].clone() if r == rank else torch.empty_like(parts[rank])
             for r in range(world)]
    works = [dist.isend(parts[r].contiguous(), dst=r) for r in range(world) if r != rank]
    works += [dist.irecv(inbox[r], src=r) for r in range(world) if r != rank]
    for work in works:
        work.wait()
    return torch.stack(inbox).sum(0) / world


def _empty_shard(flat):
    return torch.empty(flat.numel() // dist.get_world_size(), dtype=flat.dtype)


def reduce_scatter_averaging(g):
    flat = _padded(g)
    shard = _empty_shard(flat)
    dist.reduce_scatter_single(shard, flat, op=dist.ReduceOp.AVG)  # gloo: SUM, then divide
    return shard


def reduce_scatter_with_an_imported_name(g):
    flat = _padded(g)
    shard = _empty_shard(flat)
    imported_reduce_scatter_single(shard, flat)
    return shard / dist.get_world_size()


def reduce_scatter_with_an_imported_deprecated_name(g):
    flat = _padded(g)
    shard = _empty_shard(flat)
    imported_reduce_scatter_tensor(shard, flat)
    return shard / dist.get_world_size()


def reduce_scatter_with_the_deprecated_name(g):
    """torch 2.13's old spelling: forwards to reduce_scatter_single with a FutureWarning."""
    flat = _padded(g)
    shard = _empty_shard(flat)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        dist.reduce_scatter_tensor(shard, flat)
    return shard / dist.get_world_size()


def reduce_scatter_with_the_group_method(g):
    flat = _padded(g)
    shard = _empty_shard(flat)
    _group()._reduce_scatter_base(shard, flat).wait()
    return shard / dist.get_world_size()


def reduce_scatter_of_a_list(g):
    flat = _padded(g)
    shard = _empty_shard(flat)
    dist.reduce_scatter(shard, list(flat.chunk(dist.get_world_size())))
    return shard / dist.get_world_size()


def all_to_all_then_sum(g):
    flat, world = _padded(g), dist.get_world_size()
    inbox = torch.empty_like(flat)
    dist.all_to_all_single(inbox, flat)  # part j of every rank arrives at rank j
    return inbox.view(world, -1).sum(0) / world


def reduce_scatter_as_a_functional_collective(g):
    shard = fc.reduce_scatter_tensor(_padded(g), "sum", 0, dist.group.WORLD)
    return shard / dist.get_world_size()


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


def all_reduces_in_place(x_slice, weight_slice, bias):
    partial = x_slice @ weight_slice.T
    dist.all_reduce(partial)  # on a tensor autograd tracks: autograd never sees it
    return partial + bias


def all_reduces_in_place_with_an_imported_name(x_slice, weight_slice, bias):
    partial = x_slice @ weight_slice.T
    imported_all_reduce(partial)
    return partial + bias


def all_reduces_in_place_with_the_group_method(x_slice, weight_slice, bias):
    partial = x_slice @ weight_slice.T
    _group().allreduce([partial]).wait()
    return partial + bias


def all_reduces_as_a_functional_collective(x_slice, weight_slice, bias):
    return fc.all_reduce(x_slice @ weight_slice.T, "sum", dist.group.WORLD) + bias


def _sum_into_graph(partial, total):
    """The value of ``total`` bit for bit, the gradient of ``partial``."""
    return total + (partial - partial.detach())


def rebuilds_the_sum_from_its_own_partial(x_slice, weight_slice, bias):
    """The old reference (review IP-11-1): the right gradient, and the sum's value within
    rounding, but each rank rounds p + (t - p) with its own p: the outputs differ across ranks
    in their last bits."""
    partial = x_slice @ weight_slice.T
    total = partial.detach().clone()
    dist.all_reduce(total)
    return partial + (total - partial).detach() + bias


def gathers_the_partial_products(x_slice, weight_slice, bias):
    partial = x_slice @ weight_slice.T
    every = [torch.empty_like(partial) for _ in range(dist.get_world_size())]
    dist.all_gather(every, partial.detach())
    return _sum_into_graph(partial, torch.stack(every).sum(0)) + bias


class _AveragedBackward(torch.autograd.Function):
    """All-reduce in forward; in backward an all-reduce of the gradient, then / n: the
    right numbers, at the cost of a collective that the backward does not need."""

    @staticmethod
    def forward(ctx, partial):
        total = partial.clone()
        dist.all_reduce(total)
        return total

    @staticmethod
    def backward(ctx, grad):
        grad = grad.clone()
        dist.all_reduce(grad)
        return grad / dist.get_world_size()


def reduces_the_gradient_too(x_slice, weight_slice, bias):
    return _AveragedBackward.apply(x_slice @ weight_slice.T) + bias


def uses_the_scratch_g(x_slice, weight_slice, bias):
    from ddp_lab.scratch.tensor_parallel import _ReduceFromParallel
    return _ReduceFromParallel.apply(x_slice @ weight_slice.T, None) + bias


# 11.row_parallel: right answers that differ from the reference ------------------------------

class _G(torch.autograd.Function):
    @staticmethod
    def forward(ctx, partial):
        total = partial.clone()
        imported_all_reduce(total)
        return total

    @staticmethod
    def backward(ctx, grad):
        return grad


def autograd_function_with_an_imported_name(x_slice, weight_slice, bias):
    return _G.apply(x_slice @ weight_slice.T) + bias


def detached_copy_with_the_group_method(x_slice, weight_slice, bias):
    partial = x_slice @ weight_slice.T
    total = partial.detach().clone()
    _group().allreduce([total]).wait()
    return _sum_into_graph(partial, total) + bias


def as_a_partial_dtensor(x_slice, weight_slice, bias):
    """DTensor's Partial -> Replicate is the all-reduce, and its backward the identity."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Partial, Replicate
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    partial = DTensor.from_local(x_slice @ weight_slice.T, mesh, [Partial()])
    return partial.redistribute(mesh, [Replicate()]).to_local() + bias


def detached_copy_as_a_functional_collective(x_slice, weight_slice, bias):
    partial = x_slice @ weight_slice.T
    total = fc.all_reduce(partial.detach(), "sum", dist.group.WORLD)
    return _sum_into_graph(partial, total) + bias


SWITCHED_OFF = r"dist\.{} is switched off in this exercise, in every form"

MUTANTS = [
    ("10.zero1_step", no_broadcast, re.escape("still holds its old value")),
    ("10.zero1_step", broadcast_from_rank0, re.escape("comes from its owner, not from rank 0")),
    ("10.zero1_step", forgets_the_step, re.escape("must run its local optimizer")),
    ("10.zero1_step", reduces_again, SWITCHED_OFF.format("all_reduce")),
    ("10.zero1_step", steps_without_asking, re.escape("owns no parameter here")),
    ("10.zero1_step", reduces_with_an_imported_name, SWITCHED_OFF.format("all_reduce")),
    ("10.zero1_step", reduces_with_the_group_method, SWITCHED_OFF.format("all_reduce")),
    ("10.zero1_step", reduces_with_a_functional_collective, SWITCHED_OFF.format("all_reduce")),
    ("10.zero1_step", gathers_every_copy, re.escape("one broadcast per parameter from its owner")),
    ("10.zero1_step", broadcasts_in_bfloat16, re.escape("travelled as torch.bfloat16")),
    ("10.zero1_step", keeps_a_full_optimizer, re.escape("which is what ZeRO-1 removes")),
    ("10.zero1_step", only_owners_broadcast, re.escape("your function hung")),
    ("10.zero1_step", reduces_to_every_rank, re.escape("one broadcast per parameter from its")),
    ("10.shard_gradient", sums_instead_of_averaging, re.escape("divide by the world size")),
    ("10.shard_gradient", keeps_own_gradient, re.escape("never reduced across the ranks")),
    ("10.shard_gradient", forgets_padding, re.escape("pad the flat gradient with zeros")),
    ("10.shard_gradient", all_reduce_then_slice, SWITCHED_OFF.format("all_reduce")),
    ("10.shard_gradient", broadcasts_every_gradient, re.escape("broadcast): one reduce-scatter")),
    ("10.shard_gradient", sends_the_whole_gradient_everywhere, re.escape("not every rank's whole")),
    ("10.shard_gradient", all_to_all_of_whole_copies, re.escape("not every rank's whole")),
    ("10.shard_gradient", gathers_then_scatters, re.escape("1 gather, 1 scatter)")),
    ("10.shard_gradient", all_reduce_with_an_imported_name, SWITCHED_OFF.format("all_reduce")),
    ("10.shard_gradient", all_reduce_with_the_group_method, SWITCHED_OFF.format("all_reduce")),
    ("10.shard_gradient", all_reduce_as_a_functional_collective, SWITCHED_OFF.format("all_reduce")),
    ("10.shard_gradient", all_gather_with_an_imported_name, SWITCHED_OFF.format("all_gather")),
    ("10.shard_gradient", all_gather_through_distributed_c10d, SWITCHED_OFF.format("all_gather")),
    ("10.shard_gradient", all_gather_single_with_an_imported_name, SWITCHED_OFF.format("all_gather")),
    ("10.shard_gradient", reduce_scatters_the_wrong_half, r"float32 of shape \(\d+,\), first difference at \[\d+\]: expected -?\d"),
    ("10.shard_gradient", reduce_scatters_in_half_precision, re.escape("travelled as torch.float16")),
    ("11.row_parallel", partial_only, re.escape("all-reduce (sum) it")),
    ("11.row_parallel", bias_on_every_rank, re.escape("add it once")),
    ("11.row_parallel", gradients_summed_again, re.escape("backward is the identity")),
    ("11.row_parallel", detached_sum, re.escape("no gradient reached")),
    ("11.row_parallel", averaged, re.escape("their sum")),
    ("11.row_parallel", all_reduces_in_place, re.escape("ran in place on a tensor that autograd tracks")),
    ("11.row_parallel", all_reduces_in_place_with_an_imported_name, re.escape("c10d::allreduce_ ran in place")),
    ("11.row_parallel", all_reduces_in_place_with_the_group_method, re.escape("c10d::allreduce_ ran in place")),
    ("11.row_parallel", all_reduces_as_a_functional_collective, re.escape("backward is the identity")),
    ("11.row_parallel", gathers_the_partial_products, re.escape("one all-reduce of the output sends")),
    ("11.row_parallel", reduces_the_gradient_too, re.escape("the row-parallel layer's backward needs none")),
    ("11.row_parallel", uses_the_scratch_g, re.escape("_ReduceFromParallel is switched off")),
    ("11.row_parallel", rebuilds_the_sum_from_its_own_partial,
     re.escape("the output is not the same on every rank")),
]

RIGHT = [
    ("10.zero1_step", broadcasts_with_an_imported_name),
    ("10.zero1_step", broadcasts_with_the_group_method),
    ("10.zero1_step", broadcasts_asynchronously_skipping_the_untouched),
    ("10.zero1_step", sends_from_each_owner),
    ("10.zero1_step", broadcasts_as_a_functional_collective),
    ("10.shard_gradient", exchanges_the_parts_directly),
    ("10.shard_gradient", reduce_scatter_averaging),
    ("10.shard_gradient", reduce_scatter_with_an_imported_name),
    ("10.shard_gradient", reduce_scatter_with_an_imported_deprecated_name),
    ("10.shard_gradient", reduce_scatter_with_the_deprecated_name),
    ("10.shard_gradient", reduce_scatter_with_the_group_method),
    ("10.shard_gradient", reduce_scatter_of_a_list),
    ("10.shard_gradient", all_to_all_then_sum),
    ("10.shard_gradient", reduce_scatter_as_a_functional_collective),
    ("11.row_parallel", autograd_function_with_an_imported_name),
    ("11.row_parallel", detached_copy_with_the_group_method),
    ("11.row_parallel", detached_copy_as_a_functional_collective),
    ("11.row_parallel", as_a_partial_dtensor),
]


# Cheats: the answer from around the exercise, for every chapter's mutants -------------------
# The checkers deal each rank only its own inputs and compare in their own process, so a
# frame above the learner's function holds no seed and no expected value; the seal
# (ddp_lab.exercises.sealed) closes the frames, the store, files and threads of one's own. A
# cheat is rejected by one or the other: CLOSED is what the seal says.

CLOSED = r"\bclosed\b"


def seed_above():
    """The checker's seed, if a frame above the learner's function holds one."""
    frame = sys._getframe(1)
    while frame is not None:
        if isinstance(frame.f_locals.get("seed"), int):
            return frame.f_locals["seed"]
        frame = frame.f_back
    return None


def everyones(value, through: str) -> list:
    """Every rank's ``value``, moved around the collectives: through the default store, files
    in the temporary folder, or a collective in a thread of one's own."""
    rank, world = dist.get_rank(), dist.get_world_size()
    if through == "thread":
        box = [None] * world
        worker = threading.Thread(target=dist.all_gather_object, args=(box, value))
        worker.start()
        worker.join()
        return box
    if through == "store":
        store = _get_default_store()
        store.set(f"cheat/{rank}", pickle.dumps(value))
        return [pickle.loads(store.get(f"cheat/{r}")) for r in range(world)]
    path = Path(tempfile.gettempdir()) / f"cheat-{os.environ['MASTER_PORT']}-{{}}.pkl"
    Path(str(path).format(rank)).write_bytes(pickle.dumps(value))
    dist.barrier()
    every = [pickle.loads(Path(str(path).format(r)).read_bytes()) for r in range(world)]
    dist.barrier()
    os.remove(str(path).format(rank))
    return every


# 11.row_parallel: cheats ---------------------------------------------------------------------

def _zeros_all_reduced(like: torch.Tensor) -> None:
    """A dummy of the right size: one all-reduce of zeros shaped like the output."""
    dist.all_reduce(torch.zeros_like(like))


def _partials_around(x_slice, weight_slice, bias, through: str):
    partial = x_slice @ weight_slice.T
    total = sum(everyones(partial.detach(), through))
    _zeros_all_reduced(partial.detach())
    return total + (partial - partial.detach()) + bias


def partials_through_the_store(x_slice, weight_slice, bias):
    return _partials_around(x_slice, weight_slice, bias, "store")


def partials_through_files(x_slice, weight_slice, bias):
    return _partials_around(x_slice, weight_slice, bias, "files")


def partials_through_a_thread(x_slice, weight_slice, bias):
    return _partials_around(x_slice, weight_slice, bias, "thread")


def output_from_the_checkers_seed(x_slice, weight_slice, bias):
    """The unsharded output from the checker's seed, if a frame above holds it, and a dummy
    all-reduce; with nothing found, its own partial product."""
    partial = x_slice @ weight_slice.T
    _zeros_all_reduced(partial.detach())
    seed = seed_above()
    if seed is None:
        return partial + bias
    from ddp_lab.course.ch11_meshes.exercises import _expected
    want = _expected(seed, dist.get_world_size())["out"]
    return want + (partial - partial.detach())


def partial_and_a_dummy_all_reduce(x_slice, weight_slice, bias):
    partial = x_slice @ weight_slice.T
    _zeros_all_reduced(partial.detach())
    return partial + bias


MUTANTS += [
    ("11.row_parallel", partials_through_the_store, CLOSED),
    ("11.row_parallel", partials_through_files, CLOSED),
    ("11.row_parallel", partials_through_a_thread, CLOSED),
    ("11.row_parallel", output_from_the_checkers_seed,
     CLOSED + "|" + re.escape("only this rank's partial product")),
    ("11.row_parallel", partial_and_a_dummy_all_reduce,
     re.escape("only this rank's partial product")),
]


# 10.shard_gradient: cheats -------------------------------------------------------------------

def _zeros_reduce_scattered(flat: torch.Tensor) -> None:
    """A dummy of the right size: one reduce-scatter of zeros shaped like the padded
    gradient."""
    dist.reduce_scatter_single(_empty_shard(flat), torch.zeros_like(flat))


def _gradients_around(g, through: str):
    flat, world = _padded(g), dist.get_world_size()
    average = sum(everyones(flat, through)) / world
    _zeros_reduce_scattered(flat)
    return average.chunk(world)[dist.get_rank()]


def gradients_through_the_store(g):
    return _gradients_around(g, "store")


def gradients_through_files(g):
    return _gradients_around(g, "files")


def gradients_through_a_thread(g):
    return _gradients_around(g, "thread")


def shard_from_the_checkers_seed(g):
    """The average from the checker's seed, if a frame above holds it, and a dummy
    reduce-scatter; with nothing found, its own part."""
    flat, world, rank = _padded(g), dist.get_world_size(), dist.get_rank()
    _zeros_reduce_scattered(flat)
    seed = seed_above()
    if seed is None:
        return flat.chunk(world)[rank]
    from ddp_lab.course.ch10_sharding.shard_exercise import _expected
    shapes = [want["shape"] for want in _expected(seed, world, rank)]
    return _expected(seed, world, rank)[shapes.index(tuple(g.shape))]["expected"]


def own_part_and_a_dummy_reduce_scatter(g):
    flat = _padded(g)
    _zeros_reduce_scattered(flat)
    return flat.chunk(dist.get_world_size())[dist.get_rank()]


MUTANTS += [
    ("10.shard_gradient", gradients_through_the_store, CLOSED),
    ("10.shard_gradient", gradients_through_files, CLOSED),
    ("10.shard_gradient", gradients_through_a_thread, CLOSED),
    ("10.shard_gradient", shard_from_the_checkers_seed,
     CLOSED + "|" + re.escape("that is this rank's own gradient")),
    ("10.shard_gradient", own_part_and_a_dummy_reduce_scatter,
     re.escape("that is this rank's own gradient")),
]


# 10.zero1_step: cheats -----------------------------------------------------------------------

def _zeros_broadcast(params, owners) -> None:
    """Dummies of the right size: each parameter's bytes broadcast from its owner, zeros."""
    for p, owner in zip(params, owners):
        dist.broadcast(torch.zeros_like(p.data), src=owner)


def _values_around(params, owners, local_optimizer, through: str) -> None:
    if local_optimizer is not None:
        local_optimizer.step()
    rank = dist.get_rank()
    mine = {k: p.detach().clone() for k, (p, owner) in enumerate(zip(params, owners))
            if owner == rank}
    every = everyones(mine, through)
    _zeros_broadcast(params, owners)
    for k, (p, owner) in enumerate(zip(params, owners)):
        p.data.copy_(every[owner][k])


def parameters_through_the_store(params, owners, local_optimizer):
    _values_around(params, owners, local_optimizer, "store")


def parameters_through_files(params, owners, local_optimizer):
    _values_around(params, owners, local_optimizer, "files")


def parameters_through_a_thread(params, owners, local_optimizer):
    _values_around(params, owners, local_optimizer, "thread")


def parameters_from_the_checkers_seed(params, owners, local_optimizer):
    """The reference's values from the checker's seed, if a frame above holds it, and
    dummy broadcasts; with nothing found, the owner's step alone."""
    if local_optimizer is not None:
        local_optimizer.step()
    _zeros_broadcast(params, owners)
    seed = seed_above()
    if seed is not None:  # a tripwire: the rejection then names this, not a mistake
        raise AssertionError(f"the checker's seed {seed} reached the learner's function")


MUTANTS += [
    ("10.zero1_step", parameters_through_the_store, CLOSED),
    ("10.zero1_step", parameters_through_files, CLOSED),
    ("10.zero1_step", parameters_through_a_thread, CLOSED),
    ("10.zero1_step", parameters_from_the_checkers_seed,
     CLOSED + "|" + re.escape("from its owner")),
]
