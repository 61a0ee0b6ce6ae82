"""Wrong answers to the capstone (notebook 07b, your own DDP): the traps a learner's DDP
falls into, each built on ddp_lab.OwnDDP with one thing changed (or written plainly),
and right answers that differ from the reference.

MUTANTS holds (exercise, wrong answer, a regex the rejection must match); RIGHT holds
(exercise, right-but-different answer); test_mutations.py checks every one. Data and
functions only, no test here."""

from __future__ import annotations

import contextlib
import sys
import threading
from time import sleep

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as fc
from torch.distributed import all_reduce



class OwnDDP(torch.nn.Module):
    """A learner's right answer, written from the recipe (not the reference's code, which
    refuses while a learner's class is checked); the mutants below change one thing in it.
    Same method and attribute names as OwnDDP, so each mutant reads as a one-line
    change."""

    def __init__(self, module, bucket_mb=None):
        super().__init__()
        self.module = module
        self.world = dist.get_world_size()
        with torch.no_grad():
            for t in [*module.parameters(), *module.buffers()]:
                dist.broadcast(t, 0)
        self.params = [q for q in module.parameters() if q.requires_grad]
        self.names = {id(q): n for n, q in module.named_parameters()}
        self.buckets = self.plan_buckets(self.params, bucket_mb)
        self.bucket_of = {}
        for index, members in enumerate(self.buckets):
            for q in members:
                self.bucket_of[id(q)] = index
        self.syncing = True
        self._new_step()
        for q in self.params:
            q.register_post_accumulate_grad_hook(self._grad_ready)

    @staticmethod
    def plan_buckets(params, bucket_mb):
        order = params[::-1]
        if bucket_mb is None:
            return [[q] for q in order]
        limit, done, filling = bucket_mb * 2 ** 20, [], {}
        for q in order:
            members, nbytes = filling.pop(q.dtype, ([], 0))
            members = members + [q]
            nbytes = nbytes + q.numel() * q.element_size()
            if nbytes >= limit:
                done.append(members)
            else:
                filling[q.dtype] = (members, nbytes)
        done.extend(members for members, _ in filling.values())
        rank_of = {id(q): i for i, q in enumerate(order)}
        done.sort(key=lambda members: rank_of[id(members[0])])
        return done

    @contextlib.contextmanager
    def no_sync(self):
        self.syncing = False
        try:
            yield
        finally:
            self.syncing = True

    def forward(self, *args, **kwargs):
        if self.in_flight or any(len(a) for a in self.arrived):
            raise RuntimeError("call sync_gradients() after every backward")
        return self.module(*args, **kwargs)

    def _new_step(self):
        self.arrived = [set() for _members in self.buckets]
        self.used, self.next_bucket, self.in_flight = set(), 0, []

    def _grad_ready(self, param):
        self.used.add(id(param))
        if self.syncing:
            seen = self.arrived[self.bucket_of[id(param)]]
            if id(param) in seen:
                raise RuntimeError("a gradient arrived twice before sync_gradients()")
            seen.add(id(param))
            self._launch_ready()

    def _launch_ready(self, held_back=False):
        while self.next_bucket < len(self.buckets):
            index = self.next_bucket
            if len(self.arrived[index]) < len(self.buckets[index]) and not held_back:
                break
            self._launch(index)
            self.next_bucket = index + 1

    def _launch(self, k):
        pieces = [torch.zeros_like(q) if q.grad is None else q.grad for q in self.buckets[k]]
        flat = torch.cat([piece.flatten() for piece in pieces]) / self.world
        self.in_flight.append((dist.all_reduce(flat, async_op=True), k, flat))

    def sync_gradients(self):
        self._launch_ready(held_back=True)
        flags = torch.tensor([1 if id(q) in self.used else 0 for q in self.params])
        dist.all_reduce(flags)
        somewhere = {id(q) for q, flag in zip(self.params, flags.tolist()) if flag > 0}
        self._wait_all([work for work, _, _ in self.in_flight])
        for _, k, flat in self.in_flight:
            start = 0
            for q in self.buckets[k]:
                piece = flat[start:start + q.numel()].reshape(q.shape)
                start += q.numel()
                if id(q) in somewhere and q.grad is None:
                    q.grad = piece.to(q.dtype).clone()
                elif id(q) in somewhere:
                    q.grad.copy_(piece)
        self._new_step()

    def _wait_all(self, works):
        for work in works:
            work.wait()


def _flat(bucket):
    """A bucket's gradients in one flat tensor (zeros where a gradient is None)."""
    return torch.cat([(q.grad if q.grad is not None else torch.zeros_like(q)).reshape(-1)
                      for q in bucket])


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


class NoBroadcast(OwnDDP):
    def __init__(self, module, bucket_mb=None):
        real = dist.broadcast
        dist.broadcast = lambda *args, **kwargs: None
        try:
            super().__init__(module, bucket_mb)
        finally:
            dist.broadcast = real


class FrozenNotBroadcast(OwnDDP):
    """Broadcasts only what trains."""

    def __init__(self, module, bucket_mb=None):
        frozen = [p for p in module.parameters() if not p.requires_grad]
        saved = [p.detach().clone() for p in frozen]
        super().__init__(module, bucket_mb)
        with torch.no_grad():
            for p, mine in zip(frozen, saved):
                p.copy_(mine)


class HooksOnFrozen(OwnDDP):
    def __init__(self, module, bucket_mb=None):
        super().__init__(module, bucket_mb)
        for p in module.parameters():
            if not p.requires_grad:
                p.register_post_accumulate_grad_hook(self._grad_ready)


class NoAverage(OwnDDP):
    def __init__(self, module, bucket_mb=None):
        super().__init__(module, bucket_mb)
        self.world = 1


class BucketsIgnored(OwnDDP):
    def __init__(self, module, bucket_mb=None):
        super().__init__(module, None)


def _mixed_plan(params, bucket_mb):
    """The buckets without a thought for dtypes: torch.cat promotes float16 silently."""
    if bucket_mb is None:
        return [[q] for q in reversed(params)]
    buckets, size = [[]], 0
    for p in reversed(params):
        buckets[-1].append(p)
        size += p.numel() * p.element_size()
        if size >= bucket_mb * 2 ** 20:
            buckets.append([])
            size = 0
    return [bucket for bucket in buckets if bucket]


class MixedDtypeBuckets(OwnDDP):
    plan_buckets = staticmethod(_mixed_plan)


class DivideAfterSum(OwnDDP):
    def _launch(self, k):
        flat = _flat(self.buckets[k])
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


class ZerosForUnused(OwnDDP):
    """Every trainable parameter gets a .grad, zeros where no rank used it."""

    def sync_gradients(self):
        super().sync_gradients()
        for p in self.params:
            if p.grad is None:
                p.grad = torch.zeros_like(p)


class LaunchWhenReady(OwnDDP):
    """Launches a bucket the moment its own gradients are final, whatever came before."""

    def _launch_ready(self, held_back=False):
        launched = {k for _, k, _ in self.in_flight}
        for k, bucket in enumerate(self.buckets):
            if k not in launched and (held_back or len(self.arrived[k]) == len(bucket)):
                self._launch(k)
        self.next_bucket = len(self.buckets) if held_back else 0


class FirstBucketOnly(OwnDDP):
    """Only bucket 0 goes during backward; the rest wait for sync_gradients()."""

    def _launch_ready(self, held_back=False):
        if held_back:
            super()._launch_ready(held_back)
        elif self.next_bucket == 0 and len(self.arrived[0]) == len(self.buckets[0]):
            self._launch(0)
            self.next_bucket = 1


class BlockingHooks(OwnDDP):
    def _launch(self, k):
        super()._launch(k)
        self.in_flight[-1][0].wait()


class ImportedAfterBackward(OwnDDP):
    """Buckets all-reduced with an imported name, all of them after backward."""

    def _grad_ready(self, param):
        self.used.add(id(param))

    def sync_gradients(self):
        for k in range(len(self.buckets)):
            flat = _flat(self.buckets[k]).div_(self.world)
            self.in_flight.append((all_reduce(flat, async_op=True), k, flat))
        self.next_bucket = len(self.buckets)
        super().sync_gradients()


class ProcessGroupAfterBackward(ImportedAfterBackward):
    def sync_gradients(self):
        for k in range(len(self.buckets)):
            flat = _flat(self.buckets[k]).div_(self.world)
            self.in_flight.append((_default_group().allreduce([flat]), k, flat))
        self.next_bucket = len(self.buckets)
        OwnDDP.sync_gradients(self)


class FunctionalAfterBackward(ImportedAfterBackward):
    def sync_gradients(self):
        for k in range(len(self.buckets)):
            flat = _flat(self.buckets[k]).div_(self.world)
            reduced = fc.all_reduce(flat, "sum", dist.group.WORLD).wait()
            self.in_flight.append((_Done(), k, reduced))
        self.next_bucket = len(self.buckets)
        OwnDDP.sync_gradients(self)


class SleepingSync(OwnDDP):
    """Sleeps a little instead of waiting on its all-reduces (the map of used parameters
    too), and reads sums that may not be there yet."""

    def sync_gradients(self):
        self._launch_ready(held_back=True)
        used = torch.tensor([int(id(q) in self.used) for q in self.params])
        dist.all_reduce(used, async_op=True)
        sleep(0.05)
        used_anywhere = {id(q) for q, count in zip(self.params, used.tolist()) if count}
        for _, k, flat in self.in_flight:
            offset = 0
            for p in self.buckets[k]:
                if id(p) in used_anywhere:
                    average = flat[offset:offset + p.numel()].view_as(p)
                    p.grad = average.clone()
                offset += p.numel()
        self._new_step()


class LongSleepingSync(OwnDDP):
    """Sleeps long enough for every sum, on every rank, every step."""

    def sync_gradients(self):
        threading.Event().wait(1.5)
        super().sync_gradients()


class BroadcastEveryStep(OwnDDP):
    """Right values, and a broadcast of every parameter from rank 0 after each step's sync
    "to keep the replicas equal": cost that DDP does not pay."""

    def sync_gradients(self):
        super().sync_gradients()
        for p in self.params:
            if p.grad is not None:
                dist.broadcast(p.grad, 0)


class AllGatherAverage(OwnDDP):
    """Averages every bucket with an all-gather and a mean: world times the bytes received."""

    def _launch(self, k):
        flat = _flat(self.buckets[k])
        pieces = [torch.empty_like(flat) for _ in range(self.world)]
        dist.all_gather(pieces, flat)
        flat.copy_(torch.stack(pieces).mean(0))
        self.in_flight.append((_Done(), k, flat))


class SilentSecondBackward(OwnDDP):
    """OwnDDP before its guards: a second backward launches nothing and
    sync_gradients() copies the first backward's average over the sum."""

    def forward(self, *args, **kwargs):
        return self.module(*args, **kwargs)

    def _grad_ready(self, param):
        if self.syncing and id(param) in self.arrived[self.bucket_of[id(param)]]:
            return
        super()._grad_ready(param)


class NoSyncThatSyncs(OwnDDP):
    def no_sync(self):
        return contextlib.nullcontext()


class BlockingPerParameter(OwnDDP):
    """Bucketed: asynchronous. One parameter per bucket (bucket_mb=None): a blocking
    all-reduce in the hook, which waits for every rank before backward may go on."""

    def _launch(self, k):
        super()._launch(k)
        if self.bucket_mb is None:
            self.in_flight[-1][0].wait()

    def __init__(self, module, bucket_mb=None):
        self.__dict__["bucket_mb"] = bucket_mb
        super().__init__(module, bucket_mb)


class _ViewsOfTheBuckets(OwnDDP):
    """Each .grad a view of its bucket's flat buffer, filled in place by the all-reduce."""

    def _settle(self):
        pass

    def sync_gradients(self):
        self._launch_ready(held_back=True)
        flags = torch.tensor([1 if id(q) in self.used else 0 for q in self.params])
        dist.all_reduce(flags)
        somewhere = {id(q) for q, flag in zip(self.params, flags.tolist()) if flag > 0}
        self._settle()
        for _, k, flat in self.in_flight:
            start = 0
            for q in self.buckets[k]:
                if id(q) in somewhere:
                    q.grad = flat[start:start + q.numel()].view(q.shape)
                start += q.numel()
        self._new_step()


class NeverWaits(_ViewsOfTheBuckets):
    """sync_gradients() never waits on its work handles."""


class SleepsInsteadOfWaiting(_ViewsOfTheBuckets):
    """Sleeps 50 ms where it should wait on its work handles."""

    def _settle(self):
        sleep(0.05)


class GarbageOfTheRightSize(OwnDDP):
    """One all-reduce per bucket, of the bucket's size and dtype, in order, during backward:
    of zeros. Each rank keeps its own gradient, divided by the world size."""

    def _launch(self, k):
        flat = _flat(self.buckets[k]) / self.world
        work = dist.all_reduce(torch.zeros_like(flat), async_op=True)
        self.in_flight.append((work, k, flat))


class CallersFrameDDP(OwnDDP):
    """Looks into the frame that calls sync_gradients() for torch's gradients."""

    def sync_gradients(self):
        sys._getframe(1).f_locals.get("torchs")
        super().sync_gradients()


class StoreUsedMap(OwnDDP):
    """Shares the map of used parameters through the rendezvous store."""

    def sync_gradients(self):
        store = _default_store()
        store.set(f"used{dist.get_rank()}", str(len(self.used)))
        super().sync_gradients()


def _default_store():
    return dist.distributed_c10d._get_default_store()


# Right answers the reference does not write.
class WaitAllFutures(OwnDDP):
    """torch.futures.wait_all on the works' Futures, each chained through then()."""

    def _wait_all(self, works):
        torch.futures.wait_all([w.get_future().then(lambda f: f.value()) for w in works])


class PollsCompletion(OwnDDP):
    """Polls is_completed() until every all-reduce is done."""

    def _wait_all(self, works):
        while not all(w.is_completed() for w in works):
            sleep(0.001)


class HalfSummedInFloat32(OwnDDP):
    """The float16 bucket summed in float32: the same average, and no overflow."""

    def _launch(self, k):
        pieces = [torch.zeros_like(q) if q.grad is None else q.grad for q in self.buckets[k]]
        flat = torch.cat([piece.float().flatten() for piece in pieces]) / self.world
        self.in_flight.append((dist.all_reduce(flat, async_op=True), k, flat))


class ImportedDDP(OwnDDP):
    def _launch(self, k):
        flat = _flat(self.buckets[k]).mul_(1 / self.world)
        self.in_flight.append((all_reduce(flat, async_op=True), k, flat))


class ProcessGroupDDP(OwnDDP):
    def _launch(self, k):
        flat = _flat(self.buckets[k]).div_(self.world)
        self.in_flight.append((_default_group().allreduce([flat]), k, flat))


class WithoutNoSync(OwnDDP):
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
    ("07b.your_own_ddp", BlockingPerParameter, "waited for the other ranks"),
    ("07b.your_own_ddp", NeverWaits, "must wait on every work handle"),
    ("07b.your_own_ddp", SleepsInsteadOfWaiting, "must wait on every work handle"),
    ("07b.your_own_ddp", GarbageOfTheRightSize, "differs from torch's DDP"),
    ("07b.your_own_ddp", CallersFrameDDP, "frames above your function are closed"),
    ("07b.your_own_ddp", StoreUsedMap, "Store.set is closed"),
]


RIGHT = [
    ("07b.your_own_ddp", ImportedDDP),
    ("07b.your_own_ddp", ProcessGroupDDP),
    ("07b.your_own_ddp", WithoutNoSync),
    ("07b.your_own_ddp", HalfSummedInFloat32),
    ("07b.your_own_ddp", WaitAllFutures),
    ("07b.your_own_ddp", PollsCompletion),
]
