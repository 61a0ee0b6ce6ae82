"""DDP training steps where one rank is slower than the others ("skewed processing speeds"
in PyTorch's DDP tutorial), under a process-group timeout of your choice.

    torchrun --standalone --nproc-per-node=3 straggler.py --delay 0.05 --pg-timeout 30
    ddp_lab.run_script(script_path("straggler.py"), world_size=3, script_args=[...])

The slow rank sleeps ``--delay`` seconds per step before its forward pass (a slow disk, a
busy neighbour). Every rank times each step, the part of it before ``backward()`` and the
part through ``backward()``: ``backward()`` holds the gradient all-reduce, where the fast
ranks wait for the slow one; ``optimizer.step()`` is timed apart, not charged to it. When a wait
lasts longer than ``--pg-timeout`` (``init_process_group(timeout=...)``), the waiting ranks
give up with gloo's timeout error. A script rather than a function because each rank must
create its own process group with that timeout.
"""

from __future__ import annotations

import argparse
import time
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

import ddp_lab
from ddp_lab.course.models import ToyModel


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--delay", type=float, default=0.05, help="seconds the slow rank "
                        "sleeps per step")
    parser.add_argument("--slow-rank", type=int, default=-1, help="default: the last rank")
    parser.add_argument("--pg-timeout", type=float, default=1800.0,
                        help="init_process_group(timeout=...) in seconds (gloo's default: 30 min)")
    return parser.parse_args(argv)


def timed_steps(ddp_model, steps: int, delay: float) -> dict[str, list[float]]:
    """Seconds per step, and the parts of each step up to the start and to the end of
    ``backward()`` (the rest of the step is ``optimizer.step()``)."""
    optimizer = torch.optim.SGD(ddp_model.parameters(), lr=0.01)
    before_backward, through_backward, total = [], [], []
    for _ in range(steps):
        began = time.perf_counter()
        time.sleep(delay)  # this rank's extra work: 0 on the fast ranks
        optimizer.zero_grad()
        loss = F.mse_loss(ddp_model(torch.randn(20, 10)), torch.randn(20, 5))
        before_backward.append(time.perf_counter() - began)
        loss.backward()  # the gradient all-reduce: every rank leaves it together
        through_backward.append(time.perf_counter() - began)
        optimizer.step()
        total.append(time.perf_counter() - began)
    return {"before_backward": before_backward, "through_backward": through_backward,
            "step": total}


def main(argv=None) -> None:
    args = parse_args(argv)
    # DDP's constructor imports torch._dynamo (seconds on a busy machine) right before its
    # first collectives; ranks finishing that import at different times would already be
    # "stragglers" against a 1 s timeout. Import it before the timeout starts to matter.
    import torch._dynamo  # noqa: F401
    dist.init_process_group("gloo", init_method="env://",
                            timeout=timedelta(seconds=args.pg_timeout))
    rank, world = dist.get_rank(), dist.get_world_size()
    slow_rank = args.slow_rank % world
    torch.manual_seed(0)
    # the DDP model lives only inside timed_steps: freed after destroy_process_group (at
    # main's return) it hung now and then in gloo's teardown here (torch 2.13)
    times = timed_steps(DDP(ToyModel()), args.steps, args.delay if rank == slow_rank else 0.0)
    mean_ms = 1e3 * sum(times["step"]) / len(times["step"])
    print(f"rank {rank}{' (slow)' if rank == slow_rank else ''}: {mean_ms:.0f} ms per step",
          flush=True)
    ddp_lab.report({"rank": rank, "slow": rank == slow_rank, **times})
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
