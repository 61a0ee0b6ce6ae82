"""A DDP training loop in which one rank raises, as a real bug or a corrupt batch would.

    torchrun --standalone --nproc-per-node=2 crash_rank.py --crash-rank 1 --crash-step 2
    ddp_lab.run_script(script_path("crash_rank.py"), world_size=3, script_args=[...])

``main`` is decorated with torchelastic's ``@record``: under torchrun, the exception of a
failing worker is written as JSON to the file named by TORCHELASTIC_ERROR_FILE, and the
agent quotes that traceback in its "Root Cause (first observed failure)" summary. Without
``@record`` the summary only says "To enable traceback see: .../elastic/errors.html".
"""

from __future__ import annotations

import argparse
import os

import torch
import torch.distributed as dist
import torch.distributed.nn  # noqa: F401  (before any group: see train_cnn.py)
import torch.nn.functional as F
from torch.distributed.elastic.multiprocessing.errors import record
from torch.nn.parallel import DistributedDataParallel as DDP

from ddp_lab.course.models import ToyModel


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--crash-rank", type=int, default=1)
    parser.add_argument("--crash-step", type=int, default=2)
    parser.add_argument("--steps", type=int, default=5)
    return parser.parse_args(argv)


def load_batch(rank: int, step: int, crash: tuple[int, int]):
    """A batch of this rank's data; the one at ``crash`` (rank, step) is corrupt."""
    if (rank, step) == crash:
        raise ValueError(f"rank {rank} read a corrupt batch at step {step}")
    return torch.randn(20, 10), torch.randn(20, 5)


def train(ddp_model, args, rank: int) -> None:
    for step in range(args.steps):
        x, y = load_batch(rank, step, (args.crash_rank, args.crash_step))
        F.mse_loss(ddp_model(x), y).backward()  # peers of the failed rank wait in here
        print(f"rank {rank}: step {step} done", flush=True)


@record
def main(argv=None) -> None:
    args = parse_args(argv)
    dist.init_process_group("gloo", init_method="env://")
    rank = dist.get_rank()
    if rank == args.crash_rank and "TORCHELASTIC_ERROR_FILE" in os.environ:
        print(f"rank {rank}: TORCHELASTIC_ERROR_FILE={os.environ['TORCHELASTIC_ERROR_FILE']}",
              flush=True)
    torch.manual_seed(0)
    train(DDP(ToyModel()), args, rank)  # the model is freed before the group is destroyed
    dist.destroy_process_group()

if __name__ == "__main__":
    main()
