"""DistributedDataParallel from scratch: what torch's DDP does, in one readable class.

Three things make DDP correct and fast (see torch/nn/parallel/distributed.py and the
Reducer, torch/csrc/distributed/c10d/reducer.cpp):

1. At construction every rank takes rank 0's parameters and buffers (a broadcast), so the
   replicas start equal.
2. In backward, each gradient is all-reduced as soon as it is ready, asynchronously, while
   autograd goes on computing the earlier layers' gradients: communication overlaps
   computation. Here a ``register_post_accumulate_grad_hook`` on each parameter says when
   its ``.grad`` is final (torch/_tensor.py).
3. Small gradients are packed into buckets, so that a few large all-reduces replace many
   small ones. Buckets are filled in reverse parameter order (backward usually produces
   the last layer's gradients first) and a bucket is closed once it holds ``bucket_mb`` or
   more: the buckets of the Reducer's ``dist._compute_bucket_assignment_by_size``
   (tests/scratch/test_ddp.py), which torch uses for its first iteration only with
   ``find_unused_parameters=True``; by default torch starts with one bucket and rebuilds
   the buckets after the first iteration in the order the gradients arrived. A bucket is
   launched when all of its gradients are ready.

Before ``optimizer.step()``, ``sync_gradients()`` waits for the outstanding all-reduces and
divides by the world size (torch's DDP does this wait at the end of backward itself).
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
        params = [p for p in module.parameters() if p.requires_grad]
        self.buckets = DDP.plan_buckets(params, bucket_mb)
        self.bucket_of = {id(p): k for k, bucket in enumerate(self.buckets) for p in bucket}
        self.ready = [0] * len(self.buckets)
        self.in_flight = []  # (work, bucket index, flat buffer)
        for p in params:  # 2. hear about each gradient the moment it is final
            p.register_post_accumulate_grad_hook(self._grad_ready)

    @staticmethod
    def plan_buckets(params, bucket_mb) -> list:
        """Parameters grouped into buckets, in reverse order; one per bucket when
        ``bucket_mb`` is None."""
        if bucket_mb is None:
            return [[p] for p in reversed(params)]
        cap, buckets, size = bucket_mb * 2 ** 20, [[]], 0
        for p in reversed(params):
            buckets[-1].append(p)
            size += p.numel() * p.element_size()
            if size >= cap:
                buckets.append([])
                size = 0
        return [bucket for bucket in buckets if bucket]

    def forward(self, *args, **kwargs):
        return self.module(*args, **kwargs)

    def _grad_ready(self, param) -> None:
        k = self.bucket_of[id(param)]
        self.ready[k] += 1
        # 3. every gradient of the bucket is ready: launch it. (The Reducer also waits for
        # the buckets before it, so that all ranks launch in one order whatever autograd
        # does; for one model on every rank, autograd's order is the same anyway.)
        if self.ready[k] == len(self.buckets[k]):
            self._launch(k)

    def _launch(self, k: int) -> None:
        flat = torch.cat([p.grad.reshape(-1) for p in self.buckets[k]])
        self.in_flight.append((dist.all_reduce(flat, async_op=True), k, flat))

    def sync_gradients(self) -> None:
        """Wait for every bucket's all-reduce, and put the averages back into ``.grad``."""
        for k, count in enumerate(self.ready):
            if 0 < count < len(self.buckets[k]):  # some gradient never came: send what is there
                for p in self.buckets[k]:
                    if p.grad is None:
                        p.grad = torch.zeros_like(p)
                self._launch(k)
        for work, k, flat in self.in_flight:
            work.wait()
            flat /= self.world
            offset = 0
            for p in self.buckets[k]:
                p.grad.copy_(flat[offset:offset + p.numel()].view_as(p.grad))
                offset += p.numel()
        self.in_flight, self.ready = [], [0] * len(self.buckets)
