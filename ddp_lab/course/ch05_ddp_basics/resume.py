"""Notebook 05, part 5: checkpoints as in PyTorch's DDP tutorial, and exact resumption.

Rank 0 alone saves (all ranks hold the same weights), a barrier keeps the others from
reading a file still being written, and every rank loads with ``map_location`` so tensors
saved from ``cuda:0`` land on its own device (``ddp_lab.course.checkpoint`` does these three). A run
stopped after step s and resumed from its checkpoint must then continue like a run that was
never stopped (bit for bit on 2 ranks, to float rounding on 3 or more: a sum of three
gradients depends on the order the all-reduce adds them in): that needs the optimizer's state (momentum) in the checkpoint,
and data that depends only on (seed, step, rank), not on how long the process has lived.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

from ddp_lab.course.checkpoint import load_if_present, save_on_rank0
from ddp_lab.course.params import device_ids, flat_params
from ddp_lab.course.models import ToyModel
from ddp_lab.course.training import rank_device


@dataclass(frozen=True)
class ResumeConfig:
    steps: int = 10
    batch_size: int = 8  # per rank
    lr: float = 0.05
    momentum: float = 0.9  # optimizer state that a checkpoint must carry
    seed: int = 0


def step_batch(config: ResumeConfig, step: int, rank: int, device) -> tuple:
    """The batch of ``step`` on ``rank``: a function of (seed, step, rank) only, so a
    resumed process draws exactly what the uninterrupted one drew."""
    gen = torch.Generator().manual_seed(config.seed * 1_000_003 + step * 1009 + rank)
    x = torch.randn(config.batch_size, 10, generator=gen)
    return x.to(device), x[:, :5].sin().to(device)  # a target the model can learn


def train_toy(config: ResumeConfig = ResumeConfig(), checkpoint=None, stop_after=None,
              restore_optimizer: bool = True) -> dict:
    """Worker: DDP training of ToyModel with SGD + momentum. With ``checkpoint``: resume
    from it if the file exists, save after every step. ``stop_after``: stop after that
    step, as if the job were killed. Returns the steps this process ran, their losses
    (rank 0's) and the weights after each of them."""
    rank, device = dist.get_rank(), rank_device()
    torch.manual_seed(config.seed)
    model = ToyModel().to(device)
    ddp_model = DDP(model, device_ids=device_ids(device))
    optimizer = torch.optim.SGD(ddp_model.parameters(), lr=config.lr, momentum=config.momentum)
    start = resume(checkpoint, model, optimizer if restore_optimizer else None, device)
    history = {"steps": [], "losses": [], "weights": []}
    for step in range(start, config.steps):
        x, y = step_batch(config, step, rank, device)
        optimizer.zero_grad()
        loss = nn.functional.mse_loss(ddp_model(x), y)
        loss.backward()
        optimizer.step()
        history["steps"].append(step)
        history["losses"].append(loss.item())
        history["weights"].append(flat_params(model))
        if checkpoint is not None:
            save_on_rank0(checkpoint, {"step": step, "model": model.state_dict(),
                                       "optimizer": optimizer.state_dict()})
        if step == stop_after:
            break
    return history


def resume(checkpoint, model: nn.Module, optimizer, device) -> int:
    """Load the checkpoint on every rank (``map_location=device``) if there is one, and
    return the first step still to run. ``optimizer=None`` drops its saved state: the
    classic mistake of checkpointing the model only."""
    state = load_if_present(checkpoint, device)
    start = 0 if state is None else state["step"] + 1
    same_start_on_every_rank(checkpoint, device, step=start)
    if state is None:
        return 0
    model.load_state_dict(state["model"])
    if optimizer is not None:
        optimizer.load_state_dict(state["optimizer"])
    if dist.get_rank() == 0:
        print(f"resumed from step {state['step']}: continuing at step {state['step'] + 1}")
    return state["step"] + 1


def same_start_on_every_rank(checkpoint, device, **position: int) -> None:
    """Raise on every rank, before training, where the ranks would start at different
    positions: "save on rank 0, load on all" needs every rank to read the same file, and a
    rank that cannot see it would otherwise start from scratch without a word, its
    all-reduces paired with other steps of the others (DDP's constructor has already
    broadcast, so nothing re-syncs the weights)."""
    mine = torch.tensor(list(position.values()), dtype=torch.int64, device=device)
    lowest, highest = mine.clone(), mine.clone()
    dist.all_reduce(lowest, op=dist.ReduceOp.MIN)
    dist.all_reduce(highest, op=dist.ReduceOp.MAX)
    if not torch.equal(lowest, highest):
        spread = ", ".join(f"{name} {lo}..{hi}" for name, lo, hi in
                           zip(position, lowest.tolist(), highest.tolist()))
        raise RuntimeError(
            f"the ranks would resume at different positions ({spread}; rank "
            f"{dist.get_rank()} at {position}): not every rank sees the checkpoint "
            f"{checkpoint}. Save it where every rank reads it (a shared file system) or copy "
            "it to each node before restarting.")


def stop_and_resume(folder, stop_after: int = 4,
                    config: ResumeConfig = ResumeConfig(), world_size: int = 2) -> dict:
    """Three runs on ``world_size`` ranks, checkpoints under ``folder``: one uninterrupted,
    one stopped after ``stop_after`` then resumed, and the same resumed without the
    optimizer's state. Returns rank 0's history of each."""
    import shutil
    from pathlib import Path

    import ddp_lab

    def launch(*args, **kwargs):
        return ddp_lab.run(train_toy, world_size=world_size, args=(config, *args),
                           kwargs=kwargs, echo=False).values[0]

    path, model_only = Path(folder) / "toy.pt", Path(folder) / "toy_model_only.pt"
    runs = {"uninterrupted": launch(), "first part": launch(path, stop_after)}
    shutil.copy(path, model_only)  # the same checkpoint, for the mistake below
    runs["resumed"] = launch(path)
    runs["resumed, no optimizer state"] = launch(model_only, restore_optimizer=False)
    return runs
