"""Wrong answers to notebook 07's exercise (a communication hook that counts its bytes): the
ones a learner really writes, and right answers that differ from the reference.

MUTANTS holds (exercise, wrong answer, a regex the rejection must match); RIGHT holds
(exercise, right-but-different answer); test_mutations.py checks every one. Data and
functions only, no test here."""

from __future__ import annotations

import sys
import threading

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as fc
from torch.distributed import all_reduce


def _default_group():
    return dist.distributed_c10d._get_default_group()


def _averaged(buffer):
    return dist.all_reduce(buffer, async_op=True).get_future().then(lambda f: f.value()[0])


def _count(state, buffer):
    state["bytes"] += buffer.numel() * buffer.element_size()


def _done(value):
    future = torch.futures.Future()
    future.set_result(value)
    return future


def summing_hook(state, bucket):
    _count(state, bucket.buffer())
    return _averaged(bucket.buffer())


def uncounted_hook(state, bucket):
    return _averaged(bucket.buffer().div_(dist.get_world_size()))


def counting_elements_hook(state, bucket):
    state["bytes"] += bucket.buffer().numel()
    return _averaged(bucket.buffer().div_(dist.get_world_size()))


def local_hook(state, bucket):
    _count(state, bucket.buffer())
    return _done(bucket.buffer())


def blocking_hook(state, bucket):
    """Right values, but the hook waits for every rank before backward may go on."""
    _count(state, bucket.buffer())
    buffer = bucket.buffer().div_(dist.get_world_size())
    dist.all_reduce(buffer)
    return _done(buffer)


def imported_blocking_hook(state, bucket):
    _count(state, bucket.buffer())
    buffer = bucket.buffer().div_(dist.get_world_size())
    all_reduce(buffer, async_op=True).wait()
    return _done(buffer)


def process_group_blocking_hook(state, bucket):
    _count(state, bucket.buffer())
    buffer = bucket.buffer().div_(dist.get_world_size())
    _default_group().allreduce([buffer]).wait()
    return _done(buffer)


def functional_hook(state, bucket):
    _count(state, bucket.buffer())
    buffer = bucket.buffer().div_(dist.get_world_size())
    return _done(fc.all_reduce(buffer, "sum", dist.group.WORLD).wait())


def sleeping_hook(state, bucket):
    """Launches the all-reduce, then sleeps instead of handing DDP its future."""
    _count(state, bucket.buffer())
    buffer = bucket.buffer().div_(dist.get_world_size())
    dist.all_reduce(buffer, async_op=True)
    threading.Event().wait(0.2)
    return _done(buffer)


def twice_sent_hook(state, bucket):
    """Counts the bucket once and sends it twice (a second all-reduce of zeros)."""
    _count(state, bucket.buffer())
    dist.all_reduce(torch.zeros_like(bucket.buffer()), async_op=True)
    return _averaged(bucket.buffer().div_(dist.get_world_size()))


def float64_hook(state, bucket):
    """Counts float32 bytes but sends float64 ones: twice the traffic."""
    _count(state, bucket.buffer())
    wide = bucket.buffer().double().div_(dist.get_world_size())
    work = dist.all_reduce(wide, async_op=True)
    return work.get_future().then(lambda f: f.value()[0].float())


def imported_hook(state, bucket):
    _count(state, bucket.buffer())
    buffer = bucket.buffer().div_(dist.get_world_size())
    return all_reduce(buffer, async_op=True).get_future().then(lambda f: f.value()[0])


def process_group_hook(state, bucket):
    _count(state, bucket.buffer())
    buffer = bucket.buffer().div_(dist.get_world_size())
    return _default_group().allreduce([buffer]).get_future().then(lambda f: f.value()[0])


def divide_after_hook(state, bucket):
    _count(state, bucket.buffer())
    world = dist.get_world_size()
    future = dist.all_reduce(bucket.buffer(), async_op=True).get_future()
    return future.then(lambda f: f.value()[0] / world)


# -- cheats and floors ----------------------------------------------------------------------
def garbage_of_the_right_size_hook(state, bucket):
    """An all-reduce of the bucket's size and dtype, of zeros: every byte counted and sent,
    and each rank keeps its own gradient."""
    _count(state, bucket.buffer())
    dist.all_reduce(torch.zeros_like(bucket.buffer()), async_op=True)
    return _done(bucket.buffer())


def float16_hook(state, bucket):
    """Sends the bucket in float16: half the bytes it counts, and the low bits lost."""
    _count(state, bucket.buffer())
    narrow = bucket.buffer().half().div_(dist.get_world_size())
    work = dist.all_reduce(narrow, async_op=True)
    return work.get_future().then(lambda f: f.value()[0].float())


def callers_frame_hook(state, bucket):
    """Looks in the frame that called it for the expected gradients."""
    _count(state, bucket.buffer())
    sys._getframe(1).f_locals.get("expected")
    return _averaged(bucket.buffer().div_(dist.get_world_size()))


def store_counting_hook(state, bucket):
    """Keeps its byte count in the rendezvous store."""
    store = dist.distributed_c10d._get_default_store()
    buffer = bucket.buffer()
    state["bytes"] = store.add(f"bytes{dist.get_rank()}", buffer.numel() * buffer.element_size())
    return _averaged(buffer.div_(dist.get_world_size()))


MUTANTS = [
    ("07.counting_hook", summing_hook, "2x too large"),
    ("07.counting_hook", uncounted_hook, "never increased"),
    ("07.counting_hook", counting_elements_hook, "element_size"),
    ("07.counting_hook", local_hook, "kept its own gradient"),
    ("07.counting_hook", blocking_hook, "already complete"),
    ("07.counting_hook", imported_blocking_hook, "already complete"),
    ("07.counting_hook", process_group_blocking_hook, "already complete"),
    ("07.counting_hook", functional_hook, "already complete"),
    ("07.counting_hook", sleeping_hook, "already complete"),
    ("07.counting_hook", twice_sent_hook, "all-reduced .* bytes"),
    ("07.counting_hook", float64_hook, "all-reduced .* bytes"),
    ("07.counting_hook", garbage_of_the_right_size_hook,
     "kept its own gradient|already complete"),
    ("07.counting_hook", float16_hook, "all-reduced .* bytes|differ from DDP's average"),
    ("07.counting_hook", callers_frame_hook, "frames above your function are closed"),
    ("07.counting_hook", store_counting_hook, "Store.add is closed"),
]


RIGHT = [
    ("07.counting_hook", imported_hook),
    ("07.counting_hook", process_group_hook),
    ("07.counting_hook", divide_after_hook),
]
