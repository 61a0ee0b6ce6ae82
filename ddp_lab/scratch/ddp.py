"""DistributedDataParallel from scratch: what torch's DDP does, in one readable class.

Three things make DDP correct and fast (see torch/nn/parallel/distributed.py and the
Reducer, torch/csrc/distributed/c10d/reducer.cpp upstream; this torch ships its header,
include/torch/csrc/distributed/c10d/reducer.hpp):

1. At construction every rank takes rank 0's parameters and buffers (a broadcast), so the
   replicas start equal: all of them, frozen ones too (``_sync_module_states``,
   torch/distributed/utils.py:305-326).
2. In backward, each gradient is all-reduced as soon as it is ready, asynchronously, while
   autograd goes on computing the earlier layers' gradients: communication overlaps
   computation. Here a ``register_post_accumulate_grad_hook`` on each parameter that trains
   says when its ``.grad`` is final (torch/_tensor.py; it refuses a frozen parameter).
3. Small gradients are packed into buckets, so that a few large all-reduces replace many
   small ones. Buckets are filled in reverse parameter order (backward usually produces
   the last layer's gradients first), one dtype per bucket, and a bucket is closed once it
   holds ``bucket_mb`` or more: the buckets of the Reducer's
   ``dist._compute_bucket_assignment_by_size`` (tests/scratch/test_ddp.py), which torch uses
   for its first iteration only with ``find_unused_parameters=True``; by default torch starts
   with one bucket and rebuilds the buckets after the first iteration in the order the
   gradients arrived.

And four things keep it from being silently wrong, as in the Reducer:

* Each gradient is divided by the world size while it is copied into its bucket, before
  the sum (``mark_variable_ready_dense``: ``mul_out(bucket_view, grad, 1 / div_factor_)``),
  so a float16 sum of large gradients stays in range.
* Buckets are launched in order, bucket k only after buckets 0..k-1 (``mark_bucket_ready``:
  "Buckets are reduced in sequence"), so every rank issues the same all-reduces in the same
  order even when a parameter got no gradient on some ranks; ``sync_gradients()`` launches
  the buckets that such a parameter held back, its share zero.
* A parameter that no rank used keeps ``.grad`` None, as in torch ("If a parameter is
  globally unused, we keep its grad untouched", ``finalize_bucket_dense``): a map of the
  parameters used on this rank is all-reduced in ``sync_gradients()`` (torch does it with
  ``find_unused_parameters=True``, its ``local_used_map_``).
* Gradient accumulation is said, not guessed: inside ``with ddp.no_sync():`` gradients add
  up locally, and the first backward after it averages the sum (torch's ``no_sync``); a
  gradient that arrives a second time before ``sync_gradients()``, or a forward before it,
  is an error instead of a silent overwrite.

Before ``optimizer.step()``, ``sync_gradients()`` waits for the outstanding all-reduces and
puts the averages into ``.grad`` (torch's DDP does this wait at the end of backward itself).
"""

import torch
import torch.distributed as dist
from torch import nn


class DDP(nn.Module):
    """``DDP(module, bucket_mb=None)``: None all-reduces each gradient on its own as soon as
    it is ready; a number packs gradients into buckets of about that many MiB."""

    def __init__(self, module: nn.Module, bucket_mb=None):
        super().__init__()
        self.module = module
        self.world = dist.get_world_size()
        with torch.no_grad():  # 1. every replica starts from rank 0's state
            for tensor in list(module.parameters()) + list(module.buffers()):
                dist.broadcast(tensor, src=0)
        self.params = [p for p in module.parameters() if p.requires_grad]
        self.names = {id(p): name for name, p in module.named_parameters()}
        self.buckets = self.plan_buckets(self.params, bucket_mb)
        self.bucket_of = {id(p): k for k, bucket in enumerate(self.buckets) for p in bucket}
        self.syncing = True
        self._new_step()
        for p in self.params:  # 2. hear about each gradient the moment it is final
            p.register_post_accumulate_grad_hook(self._grad_ready)

    @staticmethod
    def plan_buckets(params, bucket_mb) -> list:
        """Parameters grouped into buckets, in reverse order, one dtype and device per
        bucket; one per bucket when ``bucket_mb`` is None. Buckets are ordered by their
        first parameter, as ``compute_bucket_assignment_by_size`` sorts them."""
        backwards = list(reversed(params))
        if bucket_mb is None:
            return [[p] for p in backwards]
        cap, closed, open_ = bucket_mb * 2 ** 20, [], {}
        for p in backwards:
            bucket, size = open_.pop((p.dtype, p.device), ([], 0))
            bucket.append(p)
            size += p.numel() * p.element_size()
            if size >= cap:
                closed.append(bucket)
            else:
                open_[(p.dtype, p.device)] = (bucket, size)
        closed += [bucket for bucket, _ in open_.values()]
        position = {id(p): i for i, p in enumerate(backwards)}
        return sorted(closed, key=lambda bucket: position[id(bucket[0])])

    def no_sync(self):
        """``with ddp.no_sync():`` gradients add up locally; the first backward after the
        block syncs the sum (torch's ``DistributedDataParallel.no_sync``)."""
        import contextlib  # here: the capstone's solved cell runs this class's source alone

        @contextlib.contextmanager
        def accumulating():
            self.syncing = False
            try:
                yield
            finally:
                self.syncing = True
        return accumulating()

    def forward(self, *args, **kwargs):
        if self.in_flight or any(self.arrived):
            raise RuntimeError("scratch.DDP: a forward before sync_gradients() finished the "
                               "last backward; call sync_gradients() after each backward, or "
                               "accumulate gradients inside `with ddp.no_sync():`")
        return self.module(*args, **kwargs)

    def _new_step(self) -> None:
        self.arrived = [set() for _ in self.buckets]  # ids of the gradients final this step
        self.used = set()  # ids of the parameters used since the last sync (no_sync too)
        self.next_bucket = 0
        self.in_flight = []  # (work, bucket index, flat buffer)

    def _grad_ready(self, param) -> None:
        self.used.add(id(param))
        if not self.syncing:
            return
        arrived = self.arrived[self.bucket_of[id(param)]]
        if id(param) in arrived:
            raise RuntimeError(f"scratch.DDP: the gradient of {self.names[id(param)]} arrived "
                               "twice before sync_gradients(); call sync_gradients() after "
                               "each backward, or accumulate inside `with ddp.no_sync():`")
        arrived.add(id(param))
        self._launch_ready()

    def _launch_ready(self, held_back: bool = False) -> None:
        """Launch the next buckets whose gradients are all final (``held_back``: all the
        rest, from sync_gradients), in bucket order on every rank."""
        while self.next_bucket < len(self.buckets):
            k = self.next_bucket
            if not held_back and len(self.arrived[k]) < len(self.buckets[k]):
                return
            self._launch(k)
            self.next_bucket += 1

    def _launch(self, k: int) -> None:
        # Divide while copying into the bucket, before the sum, as the Reducer does; a
        # gradient this rank never computed counts as zeros.
        flat = torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1)
                          for p in self.buckets[k]]).div_(self.world)
        self.in_flight.append((dist.all_reduce(flat, async_op=True), k, flat))

    def sync_gradients(self) -> None:
        """Launch the buckets held back by unused parameters, wait for every bucket's
        all-reduce, and put the averages into ``.grad`` (None where no rank used it)."""
        self._launch_ready(held_back=True)
        used = torch.tensor([int(id(p) in self.used) for p in self.params])
        dist.all_reduce(used)  # 0: no rank used it
        used_anywhere = {id(p) for p, count in zip(self.params, used.tolist()) if count}
        for work, k, flat in self.in_flight:
            work.wait()
            offset = 0
            for p in self.buckets[k]:
                average = flat[offset:offset + p.numel()].view_as(p)
                offset += p.numel()
                if id(p) not in used_anywhere:
                    continue
                if p.grad is None:
                    p.grad = average.clone()
                else:
                    p.grad.copy_(average)
        self._new_step()
