"""Causal attention's load per rank (notebook 12): with a contiguous split, rank r's queries
see the keys of ranks 0..r only, so rank 0 has one block of work and rank n-1 has n, and
every ring step waits for the busiest rank. The zig-zag split gives rank r chunks r and
2n-1-r of 2n: one early chunk and one late, the same work for all.

The work is counted from the ring's own plan (``_block_pairs``: which query and key chunks
meet, and which meetings it skips) and measured: the CPU seconds each rank spends computing
blocks (``time.thread_time``, which a busy machine's other processes do not inflate).
"""

from __future__ import annotations

import importlib
import time
from contextlib import ExitStack
from unittest import mock

import torch
import torch.distributed as dist

from ddp_lab import scratch
from ddp_lab.course.ch12_sequence.attention import AttentionConfig, inputs, shard

# The module itself (scratch's package attribute of that name is the function).
ring = importlib.import_module("ddp_lab.scratch.ring_attention")

# Blocks large enough that their arithmetic, not the Python work around each call, is what
# the clock measures: at 1024 positions and 4 heads of 32 a block took about 0.1 ms and the
# per-call work hid the 1 : 4 of the counts (rank 3 measured below rank 2 on a quiet machine).
BALANCE = AttentionConfig(batch=1, heads=8, seq=2048, head_dim=64)


def work_grid(layout: str, world: int, seq_local: int, causal: bool = True) -> list[list[int]]:
    """Score entries each rank computes at each ring step (rows: ranks, columns: steps)."""
    return [[sum(qc[2] * kc[2] for qc, kc, _ in
                 ring._block_pairs(layout, rank, (rank - step) % world, world, seq_local, causal))
             for step in range(world)] for rank in range(world)]


def _timed(fn, box: list):
    def call(*args):
        start = time.thread_time()
        try:
            return fn(*args)
        finally:
            box[0] += time.thread_time() - start
    return call


def busy_seconds(layout: str, config: AttentionConfig = BALANCE, repeats: int = 3) -> float:
    """This rank's CPU seconds in block computations of one causal ring forward (the
    least of ``repeats``)."""
    q, k, v, _ = (shard(t, layout) for t in inputs(config))
    best = float("inf")
    for _ in range(repeats):
        box = [0.0]
        with ExitStack() as stack:
            for name in ("_scores", "online_softmax_step"):
                stack.enter_context(mock.patch.object(ring, name, _timed(getattr(ring, name), box)))
            with torch.no_grad():
                scratch.ring_attention(q, k, v, causal=True, layout=layout)
        best = min(best, box[0])
    return best


def compare(config: AttentionConfig = BALANCE) -> dict:
    """Per rank: busy seconds of both layouts, and the slowest rank's wall time of each."""
    result = {}
    for layout in ring.LAYOUTS:
        dist.barrier()
        start = time.perf_counter()
        result[layout] = busy_seconds(layout, config)
        result[layout + " wall"] = time.perf_counter() - start
    return result
