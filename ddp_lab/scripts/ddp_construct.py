"""Build a DDP model and run one backward: the smallest DDP job, to try under a debug level.

    TORCH_DISTRIBUTED_DEBUG=DETAIL torchrun --standalone --nproc-per-node=2 ddp_construct.py

Under torch 2.13.0's CPU build with ``TORCH_DISTRIBUTED_DEBUG=DETAIL`` every rank dies with
SIGSEGV inside the constructor (``DistributedDataParallel._ddp_init_helper`` calling
``self.logger.set_construction_data_and_log``); with INFO or OFF it prints one line per rank.
"""

from __future__ import annotations

import os
import sys

import torch
import torch.distributed as dist
import torch.distributed.nn  # noqa: F401  (before any group: see train_cnn.py)
from torch.nn.parallel import DistributedDataParallel as DDP


def build_and_backward() -> None:
    """The model dies on return, before its group is destroyed (see ddp_lab.launch.rank.teardown
    for the deadlock a live DDP model can cause there)."""
    model = DDP(torch.nn.Linear(10, 1))
    model(torch.randn(4, 10)).sum().backward()


def main() -> None:
    dist.init_process_group("gloo")
    build_and_backward()
    level = os.environ.get("TORCH_DISTRIBUTED_DEBUG", "OFF")
    # one write per line: the ranks share torchrun's unbuffered stdout, and print() writes
    # the text and its newline separately, so two ranks' lines could run together
    sys.stdout.write(f"rank {dist.get_rank()}: DDP built and synchronized a backward "
                     f"under {level}\n")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
