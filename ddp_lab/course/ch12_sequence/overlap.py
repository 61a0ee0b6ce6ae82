"""What the ring's overlap buys (notebook 12): the same ring attention, once as written (each
step's ``isend``/``irecv`` runs while the step's block is computed, ``wait()`` after) and
once with every shift waited for at once, before the compute ("blocking"). On a slow link
with blocks that take about as long to compute as to send, the overlapped ring can hide the
sending behind the compute; the blocking one pays for both, one after the other. On a
2-core machine the sending needs CPU too (gloo's thread, the kernel shaping the link), so
the compute it overlaps with slows down and the saving varies from run to run.
"""

from __future__ import annotations

import importlib
from contextlib import contextmanager
from unittest import mock

import torch

from ddp_lab.course.ch12_sequence.attention import AttentionConfig, inputs, shard
from ddp_lab.course.timing import time_in_turns

# The module itself (scratch's package attribute of that name is the function).
ring = importlib.import_module("ddp_lab.scratch.ring_attention")

# For 2 ranks (a core each on a 2-core machine: with more ranks than cores, a rank that waits
# for the network frees a core for another, which hides the effect): 2048 positions, 4 heads
# of 128, a 4 MiB K/V block to send (about 170 ms at 200 Mbit/s) and 1024 x 1024 scores per
# head to compute per block, of the same order.
OVERLAP = AttentionConfig(batch=1, heads=4, seq=2048, head_dim=128)


@contextmanager
def blocking_shifts():
    """Inside: every ring shift is waited for as soon as it starts."""
    original = ring._shift

    def shift_and_wait(t, group, rank, world):
        incoming, works = original(t, group, rank, world)
        ring._wait(works)
        return incoming, []

    with mock.patch.object(ring, "_shift", shift_and_wait):
        yield


def compare(config: AttentionConfig = OVERLAP, iterations: int = 2) -> dict:
    """The slowest rank's seconds per (non-causal) ring forward, overlapped and blocking,
    taking turns; the least of ``iterations`` each; and the bytes of one K/V block."""
    q, k, v, _ = (shard(t) for t in inputs(config))

    def overlapped():
        with torch.no_grad():
            ring.ring_attention(q, k, v)

    def blocking():
        with blocking_shifts():
            overlapped()

    times = time_in_turns({"overlapped": overlapped, "blocking": blocking}, warmup=1,
                          iterations=iterations)
    return {**{name: min(seconds) for name, seconds in times.items()},
            "block_bytes": 2 * k.numel() * k.element_size()}

