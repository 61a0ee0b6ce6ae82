"""What ring attention and Ulysses send, and what that costs on a slow link (notebook 12).

Per rank and forward pass, ring attention sends its K/V block n-1 times: 2 (n-1) S/n x d per
head, which does not shrink as ranks are added. Ulysses runs 4 all-to-alls (q, k, v, the
output), each sending (n-1)/n of a shard of S/n x d: about 4 S/n x d per head. So the ring
sends more bytes but in n-1 steps that overlap with the blocks' compute, and on NCCL its
messages go to one neighbour; Ulysses sends less and waits for each all-to-all. Both counted
with ``course.collective_trace`` and timed with ``course.timing`` (on a shaped link, against
what its rate allows).
"""

from __future__ import annotations

import collections
import weakref

import torch
import torch.distributed as dist

from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from ddp_lab import scratch
from ddp_lab.course.ch12_sequence.attention import AttentionConfig, inputs, shard
from ddp_lab.course.collective_trace import CollectiveTrace
from ddp_lab.course.timing import time_in_turns

# Wide heads and a short sequence: many bytes per rank (a 512 KiB shard of q), little compute,
# so that a slow link's time shows.
LINK = AttentionConfig(batch=1, heads=4, seq=512, head_dim=256)
HOW = {"ring": scratch.ring_attention, "ulysses": scratch.ulysses_attention}


def sent_bytes(calls, world: int) -> float:
    """Bytes this rank sent: a send's tensor, and (n-1)/n of an all-to-all's."""
    total = 0.0
    for c in calls:
        if c.name == "send":
            total += c.nbytes
        elif c.name.startswith("alltoall"):
            total += c.nbytes * (world - 1) / world
    return total


def traced(how: str, config: AttentionConfig) -> dict:
    q, k, v, _ = (shard(t) for t in inputs(config))
    with CollectiveTrace(dist.get_world_size()) as trace, torch.no_grad():
        HOW[how](q, k, v, causal=True)
    return {"calls": [(c.name, c.nbytes) for c in trace.calls],
            "sent": sent_bytes(trace.calls, dist.get_world_size()),
            "shard_bytes": q.numel() * q.element_size()}


def cost(config: AttentionConfig = LINK, iterations: int = 3) -> dict:
    """Bytes each rank sends in one causal forward, and the slowest rank's seconds per
    forward, for both; the two take turns (``time_in_turns``)."""
    q, k, v, _ = (shard(t) for t in inputs(config))

    def step(fn):
        def run():
            with torch.no_grad():
                fn(q, k, v, causal=True)
        return run

    times = time_in_turns({how: step(fn) for how, fn in HOW.items()}, warmup=1,
                          iterations=iterations)
    return {how: {**traced(how, config), "seconds": min(times[how])} for how in HOW}


def largest_tensor(fn) -> int:
    """The bytes of the largest tensor any operation made while ``fn`` ran."""
    class Largest(TorchDispatchMode):
        biggest = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            for t in tree_leaves(out):
                if isinstance(t, torch.Tensor):
                    Largest.biggest = max(Largest.biggest, t.numel() * t.element_size())
            return out

    with Largest(), torch.no_grad():
        fn()
    return Largest.biggest


def memory(seqs=(256, 512, 1024, 2048)) -> dict:
    """Per sequence length: the largest tensor this rank makes in a causal forward of ring
    attention and of Ulysses, and (on rank 0) of textbook attention on the
    whole sequence in one process, ``softmax(q k^T / sqrt(d)) v``."""
    result = {}
    for seq in seqs:
        config = AttentionConfig(batch=1, heads=4, seq=seq, head_dim=32)
        full_q, full_k, full_v, _ = inputs(config)
        q, k, v = (shard(t) for t in (full_q, full_k, full_v))
        result[seq] = {how: largest_tensor(lambda fn=fn: fn(q, k, v, causal=True))
                       for how, fn in HOW.items()}
        if dist.get_rank() == 0:
            result[seq]["one process"] = largest_tensor(
                lambda: torch.softmax(full_q @ full_k.transpose(-2, -1) / 32 ** 0.5, -1) @ full_v)
    return result


class LiveTensors(TorchDispatchMode):
    """``with LiveTensors(): ...``: the storages that operations made while it was active
    and that are still alive, after every operation: ``peak`` (most bytes alive at once),
    ``most[nbytes]`` (most storages of that size alive at once) and ``computing[nbytes]``
    (the same, counted only at the matrix products, i.e. while a block is computed).
    Tensors that existed before (the inputs, what autograd saved) are not counted. A storage
    leaves the count when Python frees it: a weak reference with a callback, as torch's
    ``MemTracker`` does (``torch/distributed/_tools/mem_tracker.py``, ``_WeakRefInfo``)."""

    def __init__(self):
        super().__init__()
        self.live: dict[int, int] = {}  # id of the storage -> its bytes
        self.refs: dict[int, weakref.ref] = {}
        self.bytes = self.peak = 0
        self.most: collections.Counter = collections.Counter()
        self.computing: collections.Counter = collections.Counter()

    def _freed(self, key):
        self.refs.pop(key, None)
        self.bytes -= self.live.pop(key, 0)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in tree_leaves(out):
            if isinstance(t, torch.Tensor):
                storage = t.untyped_storage()  # a view's is its base's: counted once
                key = id(storage)
                if key not in self.live:
                    self.live[key] = storage.nbytes()
                    self.refs[key] = weakref.ref(storage, lambda _, key=key: self._freed(key))
                    self.bytes += storage.nbytes()
        sizes = collections.Counter(self.live.values())
        computing = func.__name__.startswith(("mm", "bmm"))
        for nbytes, count in sizes.items():
            self.most[nbytes] = max(self.most[nbytes], count)
            if computing:
                self.computing[nbytes] = max(self.computing[nbytes], count)
        self.peak = max(self.peak, self.bytes)
        return out


def ring_messages(config: AttentionConfig = AttentionConfig(batch=1, heads=2, seq=64, head_dim=16)) -> dict:
    """The messages this rank sends in one causal forward and one backward of the (zig-zag)
    ring: forward n-1 K/V blocks; backward n-1 K/V blocks and n dK/dV blocks (each one hop
    on, the last one home). Also the bytes of a K/V block, and of its float32 gradients
    (the same in float32), and what the ring made and kept alive at once (:class:`LiveTensors`):
    per pass, the peak bytes, and how many K/V-sized buffers were alive at most, at any
    operation and while a block was computed."""
    q, k, v, upstream = (shard(t, "zigzag") for t in inputs(config))
    q, k, v = (t.requires_grad_() for t in (q, k, v))
    with CollectiveTrace(dist.get_world_size()) as fwd, LiveTensors() as fwd_live:
        out = scratch.ring_attention(q, k, v, causal=True, layout="zigzag")
    with CollectiveTrace(dist.get_world_size()) as bwd, LiveTensors() as bwd_live:
        (out * upstream).sum().backward()
    kv_bytes = 2 * k.numel() * k.element_size()
    return {"forward": [c.nbytes for c in fwd.calls if c.name == "send"],
            "backward": [c.nbytes for c in bwd.calls if c.name == "send"],
            "kv_bytes": kv_bytes, "grad_kv_bytes": 2 * k.numel() * 4,
            "live": {phase: {"peak": live.peak, "kv_most": live.most[kv_bytes],
                             "kv_computing": live.computing[kv_bytes]}
                     for phase, live in (("forward", fwd_live), ("backward", bwd_live))}}
