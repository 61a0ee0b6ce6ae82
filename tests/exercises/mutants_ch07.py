"""Wrong answers to the exercises of notebooks 07 and 07b (the capstone): the ones a learner
really writes.

MUTANTS holds (exercise, wrong answer, a regex the rejection must match); test_mutations.py
checks every one with a single parametrized test. Data and functions only, no test here."""

from __future__ import annotations

import torch
import torch.distributed as dist

from ddp_lab import scratch

# -- 07 --------------------------------------------------------------------------------------
def _averaged(buffer):
    return dist.all_reduce(buffer, async_op=True).get_future().then(lambda f: f.value()[0])


def summing_hook(state, bucket):
    state["bytes"] += bucket.buffer().numel() * bucket.buffer().element_size()
    return _averaged(bucket.buffer())


def uncounted_hook(state, bucket):
    return _averaged(bucket.buffer().div_(dist.get_world_size()))


def counting_elements_hook(state, bucket):
    state["bytes"] += bucket.buffer().numel()
    return _averaged(bucket.buffer().div_(dist.get_world_size()))


def local_hook(state, bucket):
    state["bytes"] += bucket.buffer().numel() * bucket.buffer().element_size()
    future = torch.futures.Future()
    future.set_result(bucket.buffer())
    return future


# -- 07b: the capstone -----------------------------------------------------------------------
class AllReduceAfterBackward(torch.nn.Module):
    def __init__(self, module, bucket_mb=None):
        super().__init__()
        self.module = module
        for tensor in list(module.parameters()) + list(module.buffers()):
            dist.broadcast(tensor.data, 0)

    def forward(self, *args):
        return self.module(*args)

    def sync_gradients(self):
        for p in self.module.parameters():
            dist.all_reduce(p.grad)
            p.grad /= dist.get_world_size()


class NoBroadcast(scratch.DDP):
    def __init__(self, module, bucket_mb=None):
        real = dist.broadcast
        dist.broadcast = lambda *args, **kwargs: None
        try:
            super().__init__(module, bucket_mb)
        finally:
            dist.broadcast = real


class NoAverage(scratch.DDP):
    def __init__(self, module, bucket_mb=None):
        super().__init__(module, bucket_mb)
        self.world = 1


class BucketsIgnored(scratch.DDP):
    def __init__(self, module, bucket_mb=None):
        super().__init__(module, None)


MUTANTS = [
    ("07.counting_hook", summing_hook, "2x too large"),
    ("07.counting_hook", uncounted_hook, "never increased"),
    ("07.counting_hook", counting_elements_hook, "element_size"),
    ("07.counting_hook", local_hook, "kept its own gradient"),
    ("07b.your_own_ddp", AllReduceAfterBackward, "after backward had ended"),
    ("07b.your_own_ddp", NoBroadcast, "right after construction"),
    ("07b.your_own_ddp", NoAverage, "divide by the world size"),
    ("07b.your_own_ddp", BucketsIgnored, "one per bucket"),
]
