"""Wrong answers to the capstone (notebook 07b, your own DDP): the traps a learner's DDP
falls into, each built on ddp_lab.scratch.DDP with one thing changed (or written plainly),
and right answers that differ from the reference.

MUTANTS holds (exercise, wrong answer, a regex the rejection must match); RIGHT holds
(exercise, right-but-different answer); test_mutations.py checks every one. Data and
functions only, no test here."""

from __future__ import annotations

import contextlib
import threading
from time import sleep

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as fc
from torch.distributed import all_reduce

from ddp_lab import scratch


def _default_group():
    return dist.distributed_c10d._get_default_group()


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
            if p.grad is not None:
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


class FrozenNotBroadcast(scratch.DDP):
    """Broadcasts only what trains."""

    def __init__(self, module, bucket_mb=None):
        frozen = [p for p in module.parameters() if not p.requires_grad]
        saved = [p.detach().clone() for p in frozen]
        super().__init__(module, bucket_mb)
        with torch.no_grad():
            for p, mine in zip(frozen, saved):
                p.copy_(mine)


class HooksOnFrozen(scratch.DDP):
    def __init__(self, module, bucket_mb=None):
        super().__init__(module, bucket_mb)
        for p in module.parameters():
            if not p.requires_grad:
                p.register_post_accumulate_grad_hook(self._grad_ready)


class NoAverage(scratch.DDP):
    def __init__(self, module, bucket_mb=None):
        super().__init__(module, bucket_mb)
        self.world = 1


class BucketsIgnored(scratch.DDP):
    def __init__(self, module, bucket_mb=None):
        super().__init__(module, None)


def _mixed_plan(params, bucket_mb):
    """The buckets without a thought for dtypes: torch.cat promotes float16 silently."""
    if bucket_mb is None:
        return [[p] for p in reversed(params)]
    buckets, size = [[]], 0
    for p in reversed(params):
        buckets[-1].append(p)
        size += p.numel() * p.element_size()
        if size >= bucket_mb * 2 ** 20:
            buckets.append([])
            size = 0
    return [bucket for bucket in buckets if bucket]


class MixedDtypeBuckets(scratch.DDP):
    plan_buckets = staticmethod(_mixed_plan)


class DivideAfterSum(scratch.DDP):
    def _launch(self, k):
        flat = torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1)
                          for p in self.buckets[k]])
        self.in_flight.append((dist.all_reduce(flat, async_op=True), k, flat))

    def sync_gradients(self):
        self._launch_ready(held_back=True)
        for work, _, flat in self.in_flight:
            work.wait()
            flat /= self.world
        self.in_flight = [(_Done(), k, flat) for _, k, flat in self.in_flight]
        super().sync_gradients()


class _Done:
    def wait(self):
        return True


class ZerosForUnused(scratch.DDP):
    """Every trainable parameter gets a .grad, zeros where no rank used it."""

    def sync_gradients(self):
        super().sync_gradients()
        for p in self.params:
            if p.grad is None:
                p.grad = torch.zeros_like(p)


class LaunchWhenReady(scratch.DDP):
    """Launches a bucket the moment its own gradients are final, whatever came before."""

    def _launch_ready(self, held_back=False):
        launched = {k for _, k, _ in self.in_flight}
        for k, bucket in enumerate(self.buckets):
            if k not in launched and (held_back or len(self.arrived[k]) == len(bucket)):
                self._launch(k)
        self.next_bucket = len(self.buckets) if held_back else 0


class FirstBucketOnly(scratch.DDP):
    """Only bucket 0 goes during backward; the rest wait for sync_gradients()."""

    def _launch_ready(self, held_back=False):
        if held_back:
            super()._launch_ready(held_back)
        elif self.next_bucket == 0 and len(self.arrived[0]) == len(self.buckets[0]):
            self._launch(0)
            self.next_bucket = 1


class BlockingHooks(scratch.DDP):
    def _launch(self, k):
        super()._launch(k)
        self.in_flight[-1][0].wait()


class ImportedAfterBackward(scratch.DDP):
    """Buckets all-reduced with an imported name, all of them after backward."""

    def _grad_ready(self, param):
        self.used.add(id(param))

    def sync_gradients(self):
        for k in range(len(self.buckets)):
            flat = torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p))
                              .reshape(-1) for p in self.buckets[k]]).div_(self.world)
            self.in_flight.append((all_reduce(flat, async_op=True), k, flat))
        self.next_bucket = len(self.buckets)
        super().sync_gradients()


class ProcessGroupAfterBackward(ImportedAfterBackward):
    def sync_gradients(self):
        for k in range(len(self.buckets)):
            flat = torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p))
                              .reshape(-1) for p in self.buckets[k]]).div_(self.world)
            self.in_flight.append((_default_group().allreduce([flat]), k, flat))
        self.next_bucket = len(self.buckets)
        scratch.DDP.sync_gradients(self)


class FunctionalAfterBackward(ImportedAfterBackward):
    def sync_gradients(self):
        for k in range(len(self.buckets)):
            flat = torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p))
                              .reshape(-1) for p in self.buckets[k]]).div_(self.world)
            reduced = fc.all_reduce(flat, "sum", dist.group.WORLD).wait()
            self.in_flight.append((_Done(), k, reduced))
        self.next_bucket = len(self.buckets)
        scratch.DDP.sync_gradients(self)


class SleepingSync(scratch.DDP):
    """Sleeps a little instead of waiting on its all-reduces (the map of used parameters
    too), and reads sums that may not be there yet."""

    def sync_gradients(self):
        self._launch_ready(held_back=True)
        used = torch.tensor([int(id(p) in self.used) for p in self.params])
        dist.all_reduce(used, async_op=True)
        sleep(0.05)
        used_anywhere = {id(p) for p, count in zip(self.params, used.tolist()) if count}
        for _, k, flat in self.in_flight:
            offset = 0
            for p in self.buckets[k]:
                if id(p) in used_anywhere:
                    average = flat[offset:offset + p.numel()].view_as(p)
                    p.grad = average.clone()
                offset += p.numel()
        self._new_step()


class LongSleepingSync(scratch.DDP):
    """Sleeps long enough for every sum, on every rank, every step."""

    def sync_gradients(self):
        threading.Event().wait(1.5)
        super().sync_gradients()


class BroadcastEveryStep(scratch.DDP):
    """Right values, and a broadcast of every parameter from rank 0 after each step's sync
    "to keep the replicas equal": cost that DDP does not pay."""

    def sync_gradients(self):
        super().sync_gradients()
        for p in self.params:
            if p.grad is not None:
                dist.broadcast(p.grad, 0)


class AllGatherAverage(scratch.DDP):
    """Averages every bucket with an all-gather and a mean: world times the bytes received."""

    def _launch(self, k):
        flat = torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1)
                          for p in self.buckets[k]])
        pieces = [torch.empty_like(flat) for _ in range(self.world)]
        dist.all_gather(pieces, flat)
        flat.copy_(torch.stack(pieces).mean(0))
        self.in_flight.append((_Done(), k, flat))


class SilentSecondBackward(scratch.DDP):
    """scratch.DDP before its guards: a second backward launches nothing and
    sync_gradients() copies the first backward's average over the sum."""

    def forward(self, *args, **kwargs):
        return self.module(*args, **kwargs)

    def _grad_ready(self, param):
        if self.syncing and id(param) in self.arrived[self.bucket_of[id(param)]]:
            return
        super()._grad_ready(param)


class NoSyncThatSyncs(scratch.DDP):
    def no_sync(self):
        return contextlib.nullcontext()


# Right answers the reference does not write.
class ImportedDDP(scratch.DDP):
    def _launch(self, k):
        flat = torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1)
                          for p in self.buckets[k]]).mul_(1 / self.world)
        self.in_flight.append((all_reduce(flat, async_op=True), k, flat))


class ProcessGroupDDP(scratch.DDP):
    def _launch(self, k):
        flat = torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1)
                          for p in self.buckets[k]]).div_(self.world)
        self.in_flight.append((_default_group().allreduce([flat]), k, flat))


class WithoutNoSync(scratch.DDP):
    """No no_sync() at all: gradient accumulation is then refused by the guards."""

    def __getattribute__(self, name):
        if name == "no_sync":
            raise AttributeError(name)
        return super().__getattribute__(name)


MUTANTS = [
    ("07b.your_own_ddp", AllReduceAfterBackward, "after backward had ended"),
    ("07b.your_own_ddp", ImportedAfterBackward, "after backward had ended"),
    ("07b.your_own_ddp", ProcessGroupAfterBackward, "after backward had ended"),
    ("07b.your_own_ddp", FunctionalAfterBackward, "after backward had ended"),
    ("07b.your_own_ddp", FirstBucketOnly, "bucket 1's all-reduce was issued after backward"),
    ("07b.your_own_ddp", NoBroadcast, "right after construction"),
    ("07b.your_own_ddp", FrozenNotBroadcast, "right after construction, frozen"),
    ("07b.your_own_ddp", HooksOnFrozen, "doesn't require gradient"),
    ("07b.your_own_ddp", NoAverage, "divide"),
    ("07b.your_own_ddp", BucketsIgnored, "one per bucket"),
    ("07b.your_own_ddp", MixedDtypeBuckets, "one dtype per bucket"),
    ("07b.your_own_ddp", DivideAfterSum, "overflows float16.*divide first"),
    ("07b.your_own_ddp", ZerosForUnused, "torch's is None"),
    ("07b.your_own_ddp", LaunchWhenReady, "another order"),
    ("07b.your_own_ddp", BlockingHooks, "waited for the other ranks"),
    ("07b.your_own_ddp", SleepingSync, "wait|average"),
    ("07b.your_own_ddp", LongSleepingSync, "not sleep"),
    ("07b.your_own_ddp", BroadcastEveryStep, "besides one all-reduce per bucket"),
    ("07b.your_own_ddp", AllGatherAverage, "no all-reduce was issued"),
    ("07b.your_own_ddp", SilentSecondBackward, "two backward passes"),
    ("07b.your_own_ddp", NoSyncThatSyncs, "inside no_sync"),
]


RIGHT = [
    ("07b.your_own_ddp", ImportedDDP),
    ("07b.your_own_ddp", ProcessGroupDDP),
    ("07b.your_own_ddp", WithoutNoSync),
]
