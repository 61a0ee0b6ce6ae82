"""Notebook 00b: what the live ranks' process group was created with."""

from __future__ import annotations

import torch
import torch.distributed as dist


def group_timeout_s() -> float:
    """The default group's timeout on this rank, in seconds: how long a gloo collective, send
    or recv waits for a peer before it raises. ``init_process_group(timeout=)`` sets it;
    ddp_lab passes the run's (the live ranks') timeout + 60 s (launch/config.py,
    ``rank_spec``), where torch's default is 30 min (10 min for NCCL:
    T/distributed/constants.py)."""
    backend = dist.distributed_c10d._get_default_group()._get_backend(torch.device("cpu"))
    return backend.options._timeout.total_seconds()
