"""Wrong answers to the exercises of notebooks 05, 05b and 06:
the ones a learner really writes.

MUTANTS holds (exercise, wrong answer, a regex the rejection must match); test_mutations.py
checks every one with a single parametrized test. Data and functions only, no test here."""

from __future__ import annotations

import inspect
import math
import os
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as fc
import torch.nn.functional as F
from torch.distributed import all_gather_object, all_reduce
from torch.distributed.distributed_c10d import _get_default_group
from torch.utils.data import DataLoader, DistributedSampler


# -- 05 --------------------------------------------------------------------------------------
def padded_sampler(model, dataset):
    counts = torch.zeros(2)
    with torch.no_grad():
        for x, y in DataLoader(dataset, batch_size=4,
                               sampler=DistributedSampler(dataset, shuffle=False)):
            counts += torch.tensor([(model(x).argmax(dim=1) == y).sum().item(), len(y)])
    dist.all_reduce(counts)
    return (counts[0] / counts[1]).item()


def own_shard_accuracy(model, dataset):
    rank, world = dist.get_rank(), dist.get_world_size()
    x, y = dataset[list(range(rank, len(dataset), world))]
    with torch.no_grad():
        return (model(x).argmax(dim=1) == y).float().mean().item()


def mean_of_accuracies(model, dataset):
    t = torch.tensor([own_shard_accuracy(model, dataset)])
    dist.all_reduce(t)
    return (t / dist.get_world_size()).item()


def everything_everywhere(model, dataset):
    x, y = dataset.tensors
    with torch.no_grad():
        return (model(x).argmax(dim=1) == y).float().mean().item()


def builtin_sampler(n, epoch, seed):
    sampler = DistributedSampler(range(n), shuffle=True, seed=seed)
    sampler.set_epoch(epoch)
    return list(sampler)


def _shard(n, epoch, seed):
    """DistributedSampler's shard, written out (the reference itself refuses in a check)."""
    rank, world = dist.get_rank(), dist.get_world_size()
    order = torch.randperm(n, generator=torch.Generator().manual_seed(seed + epoch)).tolist()
    total = math.ceil(n / world) * world
    return [order[i % n] for i in range(rank, total, world)]


def epoch_forgotten(n, epoch, seed):
    return _shard(n, 0, seed)


def contiguous_blocks(n, epoch, seed):
    rank, world = dist.get_rank(), dist.get_world_size()
    order = torch.randperm(n, generator=torch.Generator().manual_seed(seed + epoch)).tolist()
    per = math.ceil(n / world)
    return (order * 2)[rank * per:(rank + 1) * per]


def no_padding(n, epoch, seed):
    order = torch.randperm(n, generator=torch.Generator().manual_seed(seed + epoch)).tolist()
    return order[dist.get_rank()::dist.get_world_size()]


# -- 06 --------------------------------------------------------------------------------------
def constant_rate(samples, seconds):
    return 200.0


def own_rate(samples, seconds):
    return samples / seconds


def mean_rate(samples, seconds):
    t = torch.tensor([samples / seconds])
    dist.all_reduce(t)
    return t.item() / dist.get_world_size()


def sum_over_mean_time(samples, seconds):
    t = torch.tensor([float(samples), float(seconds)], dtype=torch.float64)
    dist.all_reduce(t)
    return (t[0] / (t[1] / dist.get_world_size())).item()


# -- 05.average_gradients -------------------------------------------------------------------
def summed_not_averaged(model):
    for p in model.parameters():
        if p.grad is not None:
            dist.all_reduce(p.grad)


def rank0_gradients(model):
    for p in model.parameters():
        if p.grad is not None:
            dist.broadcast(p.grad, src=0)


def reduced_the_parameters(model):
    for p in model.parameters():
        dist.all_reduce(p.data)  # the weights instead of their gradients


def weights_only(model):
    for name, p in model.named_parameters():
        if p.grad is not None and name.endswith("weight"):
            dist.all_reduce(p.grad)
            p.grad /= dist.get_world_size()


# -- 05.average_gradients: more wrong answers --------------------------------------------------
def imported_sum_only(model):
    for p in model.parameters():
        if p.grad is not None:
            all_reduce(p.grad)


def process_group_sum_only(model):
    for p in model.parameters():
        if p.grad is not None:
            _get_default_group().allreduce([p.grad]).wait()


def functional_sum_only(model):
    for p in model.parameters():
        if p.grad is not None:
            p.grad = fc.wait_tensor(fc.all_reduce(p.grad, "sum", dist.group.WORLD))


def no_none_check(model):
    for p in model.parameters():
        dist.all_reduce(p.grad)
        p.grad /= dist.get_world_size()


def requires_grad_check_only(model):
    """Skips the frozen layer, trips on the unused one (present on every check)."""
    for p in model.parameters():
        if p.requires_grad:
            dist.all_reduce(p.grad)
            p.grad /= dist.get_world_size()


def zeros_for_missing(model):
    for p in model.parameters():
        if p.grad is None:
            p.grad = torch.zeros_like(p)
        dist.all_reduce(p.grad)
        p.grad /= dist.get_world_size()


# -- 05.average_gradients: right but different ------------------------------------------------
def imported_all_reduce_average(model):
    for p in model.parameters():
        if p.grad is not None:
            all_reduce(p.grad)
            p.grad /= dist.get_world_size()


def avg_op(model):
    """ReduceOp.AVG: gloo sums, then divides (ProcessGroupGlooDetail.hpp)."""
    for p in model.parameters():
        if p.grad is not None:
            dist.all_reduce(p.grad, op=dist.ReduceOp.AVG)


def async_then_wait(model):
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    for work in [dist.all_reduce(g, async_op=True) for g in grads]:
        work.wait()
    for g in grads:
        g /= dist.get_world_size()


def one_flat_bucket(model):
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    flat = torch.cat([g.reshape(-1) for g in grads])
    _get_default_group().allreduce([flat]).wait()
    flat /= dist.get_world_size()
    for g, piece in zip(grads, flat.split([g.numel() for g in grads])):
        g.copy_(piece.view_as(g))


def functional_avg(model):
    for p in model.parameters():
        if p.grad is not None:
            p.grad.copy_(fc.wait_tensor(fc.all_reduce(p.grad, "avg", dist.group.WORLD)))


# -- 05b: more wrong answers --------------------------------------------------------------------
def others_by_hand(model, dataset):
    """Its own share through the model, the rest by hand: no communication at all."""
    rank, world = dist.get_rank(), dist.get_world_size()
    x, y = dataset.tensors
    mine = list(range(rank, len(dataset), world))
    with torch.no_grad():
        model(x[mine])
        predicted = F.linear(x, model.weight, model.bias).argmax(dim=1)
    return (predicted == y).float().mean().item()


def accuracy_as_tensor(model, dataset):
    rank, world = dist.get_rank(), dist.get_world_size()
    x, y = dataset[list(range(rank, len(dataset), world))]
    with torch.no_grad():
        correct = (model(x).argmax(dim=1) == y).sum().item()
        counts = torch.tensor([correct, len(y)], dtype=torch.float)
    all_reduce(counts)
    return counts[0] / counts[1]


def pad_once(n, epoch, seed):
    """Pads once: not enough when n < world_size."""
    rank, world = dist.get_rank(), dist.get_world_size()
    order = torch.randperm(n, generator=torch.Generator().manual_seed(seed + epoch)).tolist()
    total = math.ceil(n / world) * world
    order += order[:total - n]
    return order[rank:total:world]


def shard_as_tensor(n, epoch, seed):
    return torch.tensor(_shard(n, epoch, seed))


def sampler_without_init(n, epoch, seed):
    """Skips the switched-off constructor and calls __iter__ on a hand-made object."""
    sampler = object.__new__(DistributedSampler)
    sampler.__dict__.update(dataset=range(n), num_replicas=dist.get_world_size(),
                            rank=dist.get_rank(), epoch=epoch, drop_last=False, shuffle=True,
                            seed=seed, num_samples=math.ceil(n / dist.get_world_size()))
    sampler.total_size = sampler.num_samples * sampler.num_replicas
    return list(iter(sampler))


# -- 05b: right but different -------------------------------------------------------------------
def gathered_counts(model, dataset):
    rank, world = dist.get_rank(), dist.get_world_size()
    x, y = dataset[list(range(rank, len(dataset), world))]
    with torch.no_grad():
        correct = int((model(x).argmax(dim=1) == y).sum()) if len(y) else 0
    everyone = [None] * world
    all_gather_object(everyone, (correct, len(y)))
    return sum(c for c, _ in everyone) / sum(t for _, t in everyone)


def contiguous_unpadded_blocks(model, dataset):
    rank, world = dist.get_rank(), dist.get_world_size()
    bounds = [len(dataset) * r // world for r in range(world + 1)]
    x, y = dataset[list(range(bounds[rank], bounds[rank + 1]))]
    counts = torch.zeros(2, dtype=torch.float64)
    with torch.no_grad():
        if len(y):
            counts[0], counts[1] = float((model(x).argmax(dim=1) == y).sum()), len(y)
    _get_default_group().allreduce([counts]).wait()
    return (counts[0] / counts[1]).item()


def shard_with_repeat_formula(n, epoch, seed):
    rank, world = dist.get_rank(), dist.get_world_size()
    order = torch.randperm(n, generator=torch.Generator().manual_seed(seed + epoch)).tolist()
    total = math.ceil(n / world) * world
    return [order[i % n] for i in range(rank, total, world)]


# -- 06: more wrong answers and right-but-different ones ---------------------------------------
def rate_as_tensor(samples, seconds):
    t = torch.tensor([float(samples)])
    s = torch.tensor([float(seconds)])
    all_reduce(t)
    all_reduce(s, op=dist.ReduceOp.MAX)
    return t / s


def max_rate_times_world(samples, seconds):
    t = torch.tensor([samples / seconds])
    _get_default_group().allreduce([t]).wait()
    return t.item()


def float32_sum_and_max(samples, seconds):
    """The first hint, in float32 tensors: passes."""
    total, slowest = torch.tensor([samples]).float(), torch.tensor([seconds])
    all_reduce(total)
    all_reduce(slowest, op=dist.ReduceOp.MAX)
    return (total / slowest).item()


def gathered_pairs(samples, seconds):
    everyone = [None] * dist.get_world_size()
    all_gather_object(everyone, (samples, seconds))
    return sum(s for s, _ in everyone) / max(t for _, t in everyone)


def functional_sum_and_max(samples, seconds):
    pair = torch.tensor([float(samples), float(seconds)], dtype=torch.float64)
    total = fc.wait_tensor(fc.all_reduce(pair[:1], "sum", dist.group.WORLD))
    slowest = fc.wait_tensor(fc.all_reduce(pair[1:], "max", dist.group.WORLD))
    return (total / slowest).item()


# -- cheats a grade must stop ------------------------------------------------------------------
def _grads(model):
    return [p.grad for p in model.parameters() if p.grad is not None]


def gradients_from_callers_frame(model):
    """Looks in the checker's frame for the other ranks' batches or the expected means."""
    caller = sys._getframe(1).f_locals
    for grad, mean in zip(_grads(model), caller.get("expected", {}).get(
            dist.get_world_size(), [])):
        grad.copy_(mean)


def dummy_all_reduce_own_gradients(model):
    """An all-reduce of the right size per gradient, of zeros: its own gradients stay."""
    for grad in _grads(model):
        dist.all_reduce(torch.zeros_like(grad))


def averaged_in_a_thread(model):
    worker = threading.Thread(target=lambda: _average_in_place(model))
    worker.start()
    worker.join()


def _average_in_place(model):
    for grad in _grads(model):
        dist.all_reduce(grad)
        grad /= dist.get_world_size()


def _exchange_by_file(rank, world, name, value):
    """Every rank's ``value`` through a shared folder: no collective, nothing counted."""
    folder = Path(tempfile.gettempdir()) / f"ch05-cheat-{os.getppid()}-{world}"
    folder.mkdir(exist_ok=True)
    torch.save(value, folder / f"{name}{rank}.part")
    os.replace(folder / f"{name}{rank}.part", folder / f"{name}{rank}.pt")
    while len(list(folder.glob(f"{name}*.pt"))) < world:
        time.sleep(0.01)
    everyone = [torch.load(folder / f"{name}{peer}.pt") for peer in range(world)]
    dist.barrier()
    if rank == 0:
        shutil.rmtree(folder)
    return everyone


def gradients_through_files(model):
    rank, world = dist.get_rank(), dist.get_world_size()
    everyone = _exchange_by_file(rank, world, "grads", _grads(model))
    for i, grad in enumerate(_grads(model)):
        grad.copy_(sum(grads[i] for grads in everyone) / world)


def gradients_through_the_store(model):
    rank, world = dist.get_rank(), dist.get_world_size()
    store = dist.distributed_c10d._get_default_store()
    for i, grad in enumerate(_grads(model)):
        store.set(f"g{i}-{rank}", grad.numpy().tobytes())
        grad.copy_(sum(torch.frombuffer(bytearray(store.get(f"g{i}-{peer}")),
                                        dtype=grad.dtype).view_as(grad)
                       for peer in range(world)) / world)


def model_forward_then_dummy_all_reduce(model, dataset):
    """The whole data set through model.forward (no __call__, no hook), and an all-reduce
    of the right size and nothing in it, to meet "at least one collective"."""
    x, y = dataset.tensors
    with torch.no_grad():
        accuracy = (model.forward(x).argmax(dim=1) == y).float().mean().item()
    dist.all_reduce(torch.zeros(2))
    return accuracy


def accuracy_from_callers_frame(model, dataset):
    caller = sys._getframe(1).f_locals
    return caller.get("expected", 0.5)


def accuracy_in_a_thread(model, dataset):
    box = []
    worker = threading.Thread(target=lambda: box.append(gathered_counts(model, dataset)))
    worker.start()
    worker.join()
    return box[0]


def shard_from_callers_frame(n, epoch, seed):
    caller = sys._getframe(1).f_locals
    return caller.get("expected", [])


def throughput_from_callers_frame(samples, seconds):
    """Looks for the check's seed or the other ranks' numbers above it."""
    caller = sys._getframe(1).f_locals
    inputs = caller.get("inputs", {}).get(dist.get_world_size(), [(samples, seconds)])
    return sum(s for s, _ in inputs) / max(t for _, t in inputs)


def throughput_walks_f_back(samples, seconds):
    """Plain f_back from its own frame, collecting every (samples, seconds) pair above."""
    frame, pairs = inspect.currentframe().f_back, {(samples, seconds)}
    while frame is not None:
        for value in frame.f_locals.values():
            if isinstance(value, list) and value and all(
                    isinstance(v, tuple) and len(v) == 2 and isinstance(v[0], int)
                    and isinstance(v[1], float) for v in value):
                pairs.update(value)
        frame = frame.f_back
    return sum(s for s, _ in pairs) / max(t for _, t in pairs)


def dummy_sum_and_max(samples, seconds):
    """Two all-reduces of the right size and dtype, of its own numbers scaled by the world
    size: the collectives are there, the other ranks' numbers are not."""
    world = dist.get_world_size()
    dist.all_reduce(torch.zeros(1, dtype=torch.float64))
    dist.all_reduce(torch.zeros(1, dtype=torch.float64), op=dist.ReduceOp.MAX)
    return samples * world / seconds


def throughput_through_the_store(samples, seconds):
    rank, world = dist.get_rank(), dist.get_world_size()
    store = dist.distributed_c10d._get_default_store()
    store.set(f"tp{rank}", f"{samples} {seconds}")
    pairs = [store.get(f"tp{peer}").decode().split() for peer in range(world)]
    return sum(int(s) for s, _ in pairs) / max(float(t) for _, t in pairs)


def throughput_through_files(samples, seconds):
    rank, world = dist.get_rank(), dist.get_world_size()
    pairs = _exchange_by_file(rank, world, "tp", (samples, seconds))
    return sum(s for s, _ in pairs) / max(t for _, t in pairs)


def throughput_in_a_thread(samples, seconds):
    box = []
    worker = threading.Thread(target=lambda: box.append(gathered_pairs(samples, seconds)))
    worker.start()
    worker.join()
    return box[0]


RIGHT = [
    ("05.average_gradients", imported_all_reduce_average),
    ("05.average_gradients", avg_op),
    ("05.average_gradients", async_then_wait),
    ("05.average_gradients", one_flat_bucket),
    ("05.average_gradients", functional_avg),
    ("05b.global_accuracy", gathered_counts),
    ("05b.global_accuracy", contiguous_unpadded_blocks),
    ("05b.sampler_shard", shard_with_repeat_formula),
    ("06.global_throughput", float32_sum_and_max),
    ("06.global_throughput", gathered_pairs),
    ("06.global_throughput", functional_sum_and_max),
]


MUTANTS = [
    ("05.average_gradients", imported_sum_only, "divide by world_size"),
    ("05.average_gradients", process_group_sum_only, "divide by world_size"),
    ("05.average_gradients", functional_sum_only, "divide by world_size"),
    ("05.average_gradients", no_none_check, "have .grad None.*frozen"),
    ("05.average_gradients", requires_grad_check_only, "have .grad None: .*'unused.weight'"),
    ("05.average_gradients", zeros_for_missing, "has no gradient"),
    ("05b.global_accuracy", others_by_hand, "without a single collective"),
    ("05b.global_accuracy", accuracy_as_tensor, "got a tensor"),
    ("05b.sampler_shard", pad_once, "DistributedSampler's shard"),
    ("05b.sampler_shard", shard_as_tensor, "return a list of ints"),
    ("05b.sampler_shard", sampler_without_init, "DistributedSampler is switched off"),
    ("06.global_throughput", rate_as_tensor, "got a tensor"),
    ("06.global_throughput", max_rate_times_world, "slowest rank's time"),
    ("05b.global_accuracy", padded_sampler, "pads the shards with repeated samples"),
    ("05b.global_accuracy", own_shard_accuracy, "without a single collective"),
    ("05b.global_accuracy", mean_of_accuracies, "divide once"),
    ("05b.global_accuracy", everything_everywhere, "evaluated the whole data set"),
    ("05b.sampler_shard", builtin_sampler, "DistributedSampler is switched off"),
    ("05b.sampler_shard", epoch_forgotten, "seed \\+ epoch"),
    ("05b.sampler_shard", contiguous_blocks, r"\[rank::world_size\]"),
    ("05b.sampler_shard", no_padding, "DistributedSampler's shard"),
    ("06.global_throughput", constant_rate, "slowest rank's time"),
    ("06.global_throughput", own_rate, "without a single collective"),
    ("06.global_throughput", mean_rate, "average of the ranks' rates"),
    ("06.global_throughput", sum_over_mean_time, "MAX"),
    ("05.average_gradients", summed_not_averaged, "divide by world_size"),
    ("05.average_gradients", rank0_gradients, "MEAN of the ranks' gradients"),
    ("05.average_gradients", reduced_the_parameters, "the parameters changed"),
    ("05.average_gradients", weights_only, "for every parameter that has a gradient"),
    # cheats a grade must stop
    ("05.average_gradients", gradients_from_callers_frame, "frames above your function are "
                                                           "closed"),
    ("05.average_gradients", dummy_all_reduce_own_gradients, "this rank.s own, unchanged"),
    ("05.average_gradients", averaged_in_a_thread, "starting a thread is closed"),
    ("05.average_gradients", gradients_through_files, "is closed in this exercise: data "
                                                      "moved through files"),
    ("05.average_gradients", gradients_through_the_store, "Store.set is closed"),
    ("05b.global_accuracy", model_forward_then_dummy_all_reduce, "evaluated the whole data "
                                                                 "set"),
    ("05b.global_accuracy", accuracy_from_callers_frame, "frames above your function are "
                                                         "closed"),
    ("05b.global_accuracy", accuracy_in_a_thread, "starting a thread is closed"),
    ("05b.sampler_shard", shard_from_callers_frame, "frames above your function are closed"),
    ("06.global_throughput", throughput_from_callers_frame, "frames above your function are "
                                                            "closed"),
    ("06.global_throughput", throughput_walks_f_back,
     "without a single collective|frames above your function are closed"),
    ("06.global_throughput", dummy_sum_and_max, "did not bring it the other ranks. numbers"),
    ("06.global_throughput", throughput_through_the_store, "Store.set is closed"),
    ("06.global_throughput", throughput_through_files, "is closed in this exercise: data "
                                                       "moved through files"),
    ("06.global_throughput", throughput_in_a_thread, "starting a thread is closed"),
]
