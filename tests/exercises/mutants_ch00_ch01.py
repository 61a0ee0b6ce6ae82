"""Wrong answers to the exercises of notebooks 00, 00b and 01, the ones a learner really
writes, and right answers that differ from the reference.

MUTANTS holds (exercise, wrong answer, a regex the rejection must match); RIGHT holds
(exercise, right-but-different answer); test_mutations.py checks every one. Each class the
checkers must see through has its mutants: names imported at the top of this module (the
way a notebook imports them), process-group methods, functional collectives,
``distributed_c10d``, sleeps (imported and ``threading.Event().wait``), and the coverage
holes (frozen weights, a swap, a float32 answer, NaN and -0.0 compared as values). Data and
functions only, no test here."""

from __future__ import annotations

import hashlib
import math
import os
import sys
import tempfile
import threading
import time
from time import sleep

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as fc
from torch.distributed import all_gather, all_gather_object, all_reduce, barrier, broadcast
from torch.distributed import distributed_c10d


def _group():
    return distributed_c10d._get_default_group()


def _vector(model, dtype=torch.float64):
    return torch.cat([p.detach().reshape(-1).to(dtype) for p in model.parameters()])


def _bits(model):
    """Every weight's bits, as int32 (the checker's models are float32)."""
    return torch.cat([p.detach().reshape(-1).view(torch.int32) for p in model.parameters()])


# -- 00 --------------------------------------------------------------------------------------
def closed_form(value):
    return float((dist.get_world_size() - 1) ** 2)


def own_value(value):
    return value


def summed(value):
    t = torch.tensor([float(value)], dtype=torch.float64)
    all_reduce(t)  # imported name, default op
    return t.item()


def returns_the_tensor(value):
    t = torch.tensor([value])
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return t


def summed_by_the_group(value):
    t = torch.tensor([float(value)], dtype=torch.float64)
    _group().allreduce([t]).wait()
    return t.item()


def functional_mean(value):
    t = torch.tensor([float(value)], dtype=torch.float64)
    return fc.all_reduce(t, "avg", dist.group.WORLD).wait().item()


def c10d_minimum(value):
    t = torch.tensor([float(value)], dtype=torch.float64)
    distributed_c10d.all_reduce(t, op=dist.ReduceOp.MIN)
    return t.item()


def hint_as_written(value):  # the hint's float32 tensor: the first hint must work
    t = torch.tensor([value])
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return t.item()


def imported_max(value):
    t = torch.tensor([float(value)], dtype=torch.float64)
    all_reduce(t, op=dist.ReduceOp.MAX)
    return t.item()


def group_method_max(value):
    t = torch.tensor([float(value)], dtype=torch.float64)
    options = dist.AllreduceOptions()
    options.reduceOp = dist.ReduceOp.MAX
    _group().allreduce([t], options).wait()
    return t.item()


def functional_max(value):
    t = torch.tensor([float(value)], dtype=torch.float64)
    return fc.all_reduce(t, "max", dist.group.WORLD).wait().item()


def gathered_objects_max(value):
    everybody = [None] * dist.get_world_size()
    all_gather_object(everybody, value)
    return max(everybody)


def max_started_at_zero(value):
    everybody = [None] * dist.get_world_size()
    all_gather_object(everybody, value)
    best = 0.0
    for each in everybody:
        best = max(best, each)
    return best


def max_over_a_tensor_of_zeros(value):
    slots = torch.zeros(dist.get_world_size(), dtype=torch.float64)
    slots[dist.get_rank()] = value
    all_reduce(slots, op=dist.ReduceOp.MAX)
    return slots.max().item()


def max_started_at_minus_infinity(value):
    everybody = [None] * dist.get_world_size()
    all_gather_object(everybody, value)
    best = -math.inf
    for each in everybody:
        best = max(best, each)
    return best


def numbers_in_the_callers_frames(value):
    """Every number the frames above hold (the checker's, if it kept them in the rank)."""
    frame, seen = sys._getframe(0).f_back, [value]
    while frame is not None:
        for local in frame.f_locals.values():
            if isinstance(local, (list, tuple, dict)):
                items = local.values() if isinstance(local, dict) else local
                seen += [x for x in items if isinstance(x, float)]
        frame = frame.f_back
    return max(seen)


def max_through_the_store(value):
    store = distributed_c10d._get_default_store()
    store.set(f"max/{dist.get_rank()}", str(value))
    return max(float(store.get(f"max/{r}")) for r in range(dist.get_world_size()))


def max_through_files(value):
    folder = os.path.join(tempfile.gettempdir(), f"max-{os.getppid()}")
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, str(dist.get_rank())), "w") as mine:
        mine.write(str(value))
    while len(os.listdir(folder)) < dist.get_world_size():
        sleep(0.01)
    return max(float(open(os.path.join(folder, name)).read()) for name in os.listdir(folder))


# -- 00b -------------------------------------------------------------------------------------
def agrees_with_itself(model):
    v = _vector(model)
    return torch.equal(v, v)


def compares_with_rank0(model):
    v = _vector(model)
    first = v.clone()
    broadcast(first, src=0)  # imported name: rank 0 alone always says True
    return torch.equal(v, first)


def compares_with_rank0_by_the_group(model):
    v = _vector(model)
    first = v.clone()
    _group().broadcast([first]).wait()
    return torch.equal(v, first)


def summed_within_tolerance(model):
    v = _vector(model, torch.float32)
    total = v.clone()
    dist.all_reduce(total)
    return torch.allclose(total, v * dist.get_world_size())


def averaged_in_place(model):
    for p in model.parameters():
        dist.all_reduce(p.data)
        p.data /= dist.get_world_size()
    return True


def max_only(model):
    v = _vector(model)
    top = v.clone()
    dist.all_reduce(top, op=dist.ReduceOp.MAX)
    return torch.equal(top, v)


def trainable_only(model):
    v = torch.cat([p.detach().reshape(-1).double() for p in model.parameters()
                   if p.requires_grad])
    both = torch.cat([v, -v])
    dist.all_reduce(both, op=dist.ReduceOp.MAX)
    return torch.equal(both[:len(v)], -both[len(v):])


def gathered_checksums(model):
    mine = _vector(model).sum().reshape(1)
    sums = [torch.empty_like(mine) for _ in range(dist.get_world_size())]
    all_gather(sums, mine)
    return all(torch.equal(s, sums[0]) for s in sums)


def functional_norm_range(model):
    norm = _vector(model).norm()
    both = fc.all_reduce(torch.stack([norm, -norm]), "max", dist.group.WORLD).wait()
    return bool(both[0] == -both[1])


def compared_as_floats(model):
    """The old reference: float64 values, so NaN != NaN and -0.0 == +0.0."""
    v = _vector(model)
    both = torch.cat([v, -v])
    dist.all_reduce(both, op=dist.ReduceOp.MAX)
    return torch.equal(both[:len(v)], -both[len(v):])


def nan_as_a_number(model):
    """NaN patched to a number: the NaN trial passes, -0.0 still compares equal to +0.0."""
    v = torch.nan_to_num(_vector(model), nan=12345.0)
    both = torch.cat([v, -v])
    dist.all_reduce(both, op=dist.ReduceOp.MAX)
    return torch.equal(both[:len(v)], -both[len(v):])


def negated_int_bits(model):
    """Bits as int32 with -x for the minimum: -(INT32_MIN) overflows to itself, and -0.0's
    bits are INT32_MIN, so +0.0 against -0.0 looks equal."""
    v = _bits(model)
    both = torch.cat([v, -v])
    dist.all_reduce(both, op=dist.ReduceOp.MAX)
    return torch.equal(both[:len(v)], -both[len(v):])


def returns_a_tensor(model):
    v = _vector(model)
    both = torch.cat([v, -v])
    dist.all_reduce(both, op=dist.ReduceOp.MAX)
    return (both[:len(v)] == -both[len(v):]).all()


def broadcast_then_vote(model):
    v = _bits(model)
    first = v.clone()
    broadcast(first, src=0)
    same = torch.tensor([int(torch.equal(v, first))])
    all_reduce(same, op=dist.ReduceOp.MIN)
    return bool(same.item())


def gathered_and_compared(model):
    v = _bits(model)
    everybody = [torch.empty_like(v) for _ in range(dist.get_world_size())]
    all_gather(everybody, v)
    return all(torch.equal(x, everybody[0]) for x in everybody)


def group_method_range(model):
    v = _bits(model).to(torch.int64)  # wide enough that -x never overflows
    both = torch.cat([v, -v])
    options = dist.AllreduceOptions()
    options.reduceOp = dist.ReduceOp.MAX
    _group().allreduce([both], options).wait()
    return torch.equal(both[:len(v)], -both[len(v):])


def compares_ranks_0_and_1(model):
    everybody = [torch.empty_like(_bits(model)) for _ in range(dist.get_world_size())]
    all_gather(everybody, _bits(model))
    return torch.equal(everybody[0], everybody[min(1, len(everybody) - 1)])


def compares_first_and_last(model):
    everybody = [torch.empty_like(_bits(model)) for _ in range(dist.get_world_size())]
    all_gather(everybody, _bits(model))
    return torch.equal(everybody[0], everybody[-1])


def fingerprint_by_hash(model):
    """Python's hash() of the bytes: salted per process, so ranks started apart disagree."""
    mine = hash(_bits(model).numpy().tobytes())
    both = torch.tensor([mine, -mine])
    all_reduce(both, op=dist.ReduceOp.MAX)
    return bool(both[0] == -both[1])


def fingerprint_by_sha256(model):
    digest = hashlib.sha256(_bits(model).numpy().tobytes()).digest()
    v = torch.tensor(list(digest), dtype=torch.int32)
    both = torch.cat([v, -v])
    all_reduce(both, op=dist.ReduceOp.MAX)
    return torch.equal(both[:len(v)], -both[len(v):])


def weights_through_the_store(model):
    store = distributed_c10d._get_default_store()
    store.set(f"weights/{dist.get_rank()}", _bits(model).numpy().tobytes())
    mine = store.get(f"weights/{dist.get_rank()}")
    return all(store.get(f"weights/{r}") == mine for r in range(dist.get_world_size()))


# -- 01.store_barrier ----------------------------------------------------------------------
def sleeping_barrier(store, world_size, name):
    time.sleep(1)


def imported_sleep_barrier(store, world_size, name):
    store.add(f"{name}/count", 1)
    sleep(0.8)


def event_wait_barrier(store, world_size, name):
    threading.Event().wait(1.6)


def leaky_barrier(store, world_size, name):
    store.add(f"{name}/count", 1)


def same_keys_every_time(store, world_size, name):
    if store.add("count", 1) == world_size:
        store.set("go", "1")
    store.wait(["go"])


def opened_one_too_early(store, world_size, name):
    if store.add(f"{name}/count", 1) >= world_size - 1:
        store.set(f"{name}/go", "1")
    store.wait([f"{name}/go"])


def torch_barrier(store, world_size, name):
    barrier()


def group_barrier(store, world_size, name):
    _group().barrier().wait()


def functional_all_reduce_barrier(store, world_size, name):
    fc.all_reduce(torch.zeros(1), "sum", dist.group.WORLD).wait()


def polling_barrier(store, world_size, name):
    store.add(f"{name}/count", 1)
    while store.add(f"{name}/count", 0) < world_size:
        sleep(0.01)


def every_rank_its_key(store, world_size, name):
    ticket = store.add(f"{name}/tickets", 1)
    store.set(f"{name}/in/{ticket}", "1")
    store.wait([f"{name}/in/{i}" for i in range(1, world_size + 1)])


def sleeps_what_the_frames_say(store, world_size, name):
    """Waits as long as the checker's frames above say the late rank is late."""
    frame, longest = sys._getframe(0).f_back, 0.0
    while frame is not None:
        for local in frame.f_locals.values():
            if isinstance(local, float) and 0.1 < local < 2.0:
                longest = max(longest, local)
        frame = frame.f_back
    sleep(longest)


def barrier_of_files(store, world_size, name):
    folder = os.path.join(tempfile.gettempdir(), f"barrier-{os.getppid()}-{name}")
    os.makedirs(folder, exist_ok=True)
    open(os.path.join(folder, str(dist.get_rank())), "w").close()
    while len(os.listdir(folder)) < world_size:
        sleep(0.01)


# -- 01.rank_ordered_print -----------------------------------------------------------------
def plain_print(line):
    print(line)


def sleep_then_print(line):
    sleep(0.3 * dist.get_rank())
    print(line, flush=True)


def barrier_then_event_wait(line):
    barrier()
    threading.Event().wait(0.2 * dist.get_rank())
    print(line, flush=True)


def reversed_turns(line):
    for turn in reversed(range(dist.get_world_size())):
        if turn == dist.get_rank():
            print(line, flush=True)
        dist.barrier()


def rank0_prints_everything(line):
    lines = [None] * dist.get_world_size()
    all_gather_object(lines, line)
    if dist.get_rank() == 0:
        for each in lines:
            print(each, flush=True)


def turns_with_imported_barrier(line):
    for turn in range(dist.get_world_size()):
        if turn == dist.get_rank():
            print(line, flush=True)
        barrier()


def turns_with_group_barrier(line):
    for turn in range(dist.get_world_size()):
        if turn == dist.get_rank():
            print(line, flush=True)
        _group().barrier().wait()


def passing_a_token(line):
    rank, world = dist.get_rank(), dist.get_world_size()
    token = torch.zeros(1)
    if rank > 0:
        dist.recv(token, rank - 1)
    print(line, flush=True)
    if rank < world - 1:
        dist.send(token, rank + 1)


def turns_taken_in_the_store(line):
    store = distributed_c10d._get_default_store()
    rank = dist.get_rank()
    if rank > 0:
        store.wait([f"printed/{rank - 1}"])
    print(line, flush=True)
    store.set(f"printed/{rank}", "1")


def sleeps_what_the_stream_says(line):
    """Waits as long as the slowest delay the frames above hold, then prints."""
    frame, longest = sys._getframe(0).f_back, 0.0
    while frame is not None:
        for local in frame.f_locals.values():
            if isinstance(local, float) and 0.1 < local < 2.0:
                longest = max(longest, local)
        frame = frame.f_back
    sleep(longest * dist.get_rank())
    print(line, flush=True)


MUTANTS = [
    ("00.max_over_ranks", closed_form, "expected the largest"),
    ("00.max_over_ranks", own_value, "own value"),
    ("00.max_over_ranks", summed, "sum of the values"),
    ("00.max_over_ranks", returns_the_tensor, "got a tensor .*item\\(\\)"),
    ("00.max_over_ranks", summed_by_the_group, "sum of the values"),
    ("00.max_over_ranks", functional_mean, "mean of the values"),
    ("00.max_over_ranks", c10d_minimum, "expected the largest"),
    ("00.max_over_ranks", max_started_at_zero, "Every value was negative"),
    ("00.max_over_ranks", max_over_a_tensor_of_zeros, "Every value was negative"),
    ("00.max_over_ranks", numbers_in_the_callers_frames,
     "frames above your function|own value|expected the largest"),
    ("00.max_over_ranks", max_through_the_store, "Store.set is closed"),
    ("00.max_over_ranks", max_through_files, "closed in this exercise: data moved through"),
    ("00b.weights_agree", agrees_with_itself, "yet every rank answered True"),
    ("00b.weights_agree", compares_with_rank0, "must give the same answer"),
    ("00b.weights_agree", compares_with_rank0_by_the_group, "must give the same answer"),
    ("00b.weights_agree", summed_within_tolerance, "must give the same answer|compare"),
    ("00b.weights_agree", averaged_in_place, "weights changed during your function"),
    ("00b.weights_agree", max_only, "must give the same answer"),
    ("00b.weights_agree", trainable_only, "Frozen weights"),
    ("00b.weights_agree", gathered_checksums, "swapped.*checksum"),
    ("00b.weights_agree", functional_norm_range, "swapped.*norm"),
    ("00b.weights_agree", returns_a_tensor, "return a bool"),
    ("00b.weights_agree", compared_as_floats, "NaN on every rank.*NaN == NaN"),
    ("00b.weights_agree", nan_as_a_number, "-0.0 where.*sign bits"),
    ("00b.weights_agree", negated_int_bits, "-0.0 where.*sign bits"),
    ("00b.weights_agree", compares_ranks_0_and_1, "rank [23]'s .*yet every rank answered True"),
    ("00b.weights_agree", compares_first_and_last, "rank [12]'s .*yet every rank answered True"),
    ("00b.weights_agree", fingerprint_by_hash, "hash\\(\\) on bytes.*salts"),
    ("00b.weights_agree", weights_through_the_store, "Store.set is closed"),
    ("01.store_barrier", sleeping_barrier, "fixed (wait|time)"),
    ("01.store_barrier", imported_sleep_barrier, "fixed (wait|time)"),
    ("01.store_barrier", event_wait_barrier, "fixed (wait|time)"),
    ("01.store_barrier", leaky_barrier, "left before it arrived"),
    ("01.store_barrier", same_keys_every_time, "keys of its own"),
    ("01.store_barrier", opened_one_too_early, "left before it arrived"),
    ("01.store_barrier", torch_barrier, "switched off .*store alone"),
    ("01.store_barrier", group_barrier, "switched off in this exercise, in every form"),
    ("01.store_barrier", functional_all_reduce_barrier, "all_reduce is switched off"),
    ("01.store_barrier", sleeps_what_the_frames_say,
     "frames above your function|left before it arrived|fixed (wait|time)"),
    ("01.store_barrier", barrier_of_files, "is closed in this exercise: data moved through"),
    ("01.rank_ordered_print", plain_print, "came out as"),
    ("01.rank_ordered_print", sleep_then_print, "fixed (wait|time)"),
    ("01.rank_ordered_print", barrier_then_event_wait, "fixed (wait|time)"),
    ("01.rank_ordered_print", reversed_turns, "only once every lower rank"),
    ("01.rank_ordered_print", rank0_prints_everything, "prints its own line"),
    ("01.rank_ordered_print", turns_taken_in_the_store, r"Store\.\w+ is closed"),
    ("01.rank_ordered_print", sleeps_what_the_stream_says,
     "frames above your function|came out as|only once every lower rank|fixed (wait|time)"),
]

RIGHT = [
    ("00.max_over_ranks", hint_as_written),
    ("00.max_over_ranks", imported_max),
    ("00.max_over_ranks", group_method_max),
    ("00.max_over_ranks", functional_max),
    ("00.max_over_ranks", gathered_objects_max),
    ("00.max_over_ranks", max_started_at_minus_infinity),
    ("00b.weights_agree", broadcast_then_vote),
    ("00b.weights_agree", gathered_and_compared),
    ("00b.weights_agree", group_method_range),
    ("00b.weights_agree", fingerprint_by_sha256),
    ("01.store_barrier", polling_barrier),
    ("01.store_barrier", every_rank_its_key),
    ("01.rank_ordered_print", turns_with_imported_barrier),
    ("01.rank_ordered_print", turns_with_group_barrier),
    ("01.rank_ordered_print", passing_a_token),
]
