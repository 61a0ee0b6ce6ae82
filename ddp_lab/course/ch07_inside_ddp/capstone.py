"""Notebook 07b (the capstone): the reference ``scratch.DDP`` on a timeline.

Each rank times one training step of a wider MLP (after a warm-up step): forward, backward,
and ``sync_gradients()``, and notes when each all-reduce was issued, through the instrument
the capstone's checker uses (``BackwardTrace``). With hooks the all-reduces start while
backward is still running, last layer first; with buckets there are fewer of them.
"""

from __future__ import annotations

import time

import torch
import torch.nn.functional as F

from ddp_lab.course.ch07_inside_ddp.backward_trace import BackwardTrace
from ddp_lab.course.models import MLPConfig, make_mlp
from ddp_lab.scratch import DDP

TIMELINE_MODEL = MLPConfig(inputs=256, width=256, depth=6, outputs=8)


def step_timeline(bucket_mb=None, batch: int = 256) -> dict:
    """On each rank: (label, start, end) spans of one step and the issue times of the
    gradients' all-reduces (one per bucket)."""
    ddp = DDP(make_mlp(TIMELINE_MODEL), bucket_mb=bucket_mb)
    x = torch.randn(batch, TIMELINE_MODEL.inputs)
    y = torch.randn(batch, TIMELINE_MODEL.outputs)
    for _ in range(2):  # the first step warms up the allocator and the connections
        ddp.module.zero_grad(set_to_none=True)
        with BackwardTrace() as trace:
            start = time.time()
            loss = F.mse_loss(ddp(x), y)
            forward_end = time.time()
            loss.backward()
            backward_end = time.time()
            ddp.sync_gradients()
            end = time.time()
    gradients = trace.all_reduces()[:len(ddp.buckets)]  # then sync_gradients()' used map
    return {"spans": [("forward", start, forward_end), ("backward", forward_end, backward_end),
                      ("sync_gradients (wait)", backward_end, end)],
            "issued": [issued.at for issued in gradients],
            "in_backward": [issued.in_backward for issued in gradients],
            "buckets": len(ddp.buckets)}
