"""Notebook 05b: resuming in the middle of an epoch.

``DistributedSampler`` keeps no position: it has ``set_epoch`` and no ``state_dict``
(torch/utils/data/distributed.py), and its order is a function of (seed, epoch, rank). So
the checkpoint records the epoch and the number of batches this epoch already consumed,
and the resumed run rebuilds the same order and skips that many batches' indices in the
sampler (``SkipSampler``), without loading them. What the step draws at random (here a
noise augmentation from the rank's global torch generator) needs the random number
generators' states in the checkpoint too, one per rank.

One trap: each time a DataLoader iterator starts, it draws a base seed for its workers from
its ``generator``, the global one by default, even with ``num_workers=0``
(``_BaseDataLoaderIter.__init__``, torch/utils/data/dataloader.py). A resumed run starts
its iterator at another point of the global stream than the uninterrupted one did, so the
loader gets a generator of its own here, seeded from (seed, epoch, rank)
(``loader_generator``): one seed for all would give every rank's workers, in every epoch,
the same seeds and so the same random augmentation, the "same seed everywhere" mistake.

torchdata's ``StatefulDataLoader`` keeps such a position in its own ``state_dict``.
"""

from __future__ import annotations

import itertools
import math
import random
import shutil
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, Sampler, TensorDataset

from ddp_lab.course.ch05_ddp_basics.resume import same_start_on_every_rank
from ddp_lab.course.checkpoint import load_if_present, save_on_rank0
from ddp_lab.course.models import ToyModel
from ddp_lab.course.params import device_ids, flat_params
from ddp_lab.course.training import rank_device


@dataclass(frozen=True)
class EpochConfig:
    samples: int = 40
    batch_size: int = 4      # per rank: 40 samples on 2 ranks are 5 steps per epoch
    epochs: int = 2
    lr: float = 0.05
    momentum: float = 0.9
    noise: float = 0.1       # augmentation drawn from each rank's global torch generator
    seed: int = 0


def dataset(config: EpochConfig) -> TensorDataset:
    """Inputs, targets and each sample's index (to show which samples a step used)."""
    g = torch.Generator().manual_seed(config.seed)
    x = torch.randn(config.samples, 10, generator=g)
    return TensorDataset(x, x[:, :5].sin(), torch.arange(config.samples))


class SkipSampler(Sampler):
    """The wrapped sampler's indices for the current epoch, less the first ``skip``."""

    def __init__(self, sampler: Sampler, skip: int):
        self.sampler, self.skip = sampler, skip

    def __iter__(self):
        return itertools.islice(iter(self.sampler), self.skip, None)

    def __len__(self) -> int:
        return len(self.sampler) - self.skip


def rng_states() -> dict:
    """This process's generators: torch, Python's random, NumPy (its key as a list of ints,
    plain data that ``torch.load(weights_only=True)`` accepts) and CUDA's where present."""
    name, key, pos, has_gauss, cached = np.random.get_state()
    states = {"torch": torch.get_rng_state(), "random": random.getstate(),
              "numpy": (name, key.tolist(), pos, has_gauss, cached)}
    if torch.cuda.is_available():
        states["cuda"] = torch.cuda.get_rng_state_all()
    return states


def set_rng_states(states: dict) -> None:
    torch.set_rng_state(states["torch"])
    random.setstate(states["random"])
    name, key, pos, has_gauss, cached = states["numpy"]
    np.random.set_state((name, np.array(key, dtype=np.uint32), pos, has_gauss, cached))
    if "cuda" in states:
        torch.cuda.set_rng_state_all(states["cuda"])


def save_position(path, model, optimizer, epoch: int, batches_done: int) -> None:
    """Rank 0 writes the model, the optimizer, the position in the data, and every rank's
    generator states (gathered to it)."""
    every_rank = [None] * dist.get_world_size()
    dist.all_gather_object(every_rank, rng_states())
    save_on_rank0(path, {"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                         "epoch": epoch, "batches_done": batches_done, "rng": every_rank})


def load_position(path, model, optimizer, device, restore_rng: bool) -> tuple[int, int]:
    """(epoch, batches already done in it) from the checkpoint, (0, 0) without one."""
    state = load_if_present(path, device)
    epoch, done = (0, 0) if state is None else (state["epoch"], state["batches_done"])
    same_start_on_every_rank(path, device, epoch=epoch, batches_done=done)
    if state is None:
        return 0, 0
    model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    if restore_rng:
        set_rng_states(state["rng"][dist.get_rank()])
    return state["epoch"], state["batches_done"]


def train_epochs(config: EpochConfig = EpochConfig(), checkpoint=None, stop_after=None,
                 restore_rng: bool = True) -> dict:
    """Worker: DDP training over a DistributedSampler's shards for ``config.epochs``; with
    ``checkpoint``, resume from it if present and save after every step; stop after global
    step ``stop_after``. Returns the steps run, their losses (rank 0's), the sample indices
    of each step, the weights after it and each epoch's loader seed."""
    rank, device = dist.get_rank(), rank_device()
    torch.manual_seed(config.seed)
    model = ToyModel().to(device)
    ddp_model = DDP(model, device_ids=device_ids(device))
    optimizer = torch.optim.SGD(ddp_model.parameters(), lr=config.lr, momentum=config.momentum)
    torch.manual_seed(config.seed + 1 + rank)          # each rank's own augmentation noise
    data = dataset(config)
    sampler = DistributedSampler(data, shuffle=True, seed=config.seed)
    start_epoch, skip = load_position(checkpoint, model, optimizer, device, restore_rng)
    history = {"steps": [], "losses": [], "samples": [], "weights": [], "loader_seeds": {}}
    steps_per_epoch = math.ceil(len(sampler) / config.batch_size)
    for epoch in range(start_epoch, config.epochs):
        sampler.set_epoch(epoch)
        first = skip if epoch == start_epoch else 0
        loader = DataLoader(data, batch_size=config.batch_size,
                            sampler=SkipSampler(sampler, first * config.batch_size),
                            generator=loader_generator(config.seed, epoch, rank))
        history["loader_seeds"][epoch] = loader.generator.initial_seed()
        for batch, (x, y, index) in enumerate(loader, start=first):
            step = epoch * steps_per_epoch + batch
            loss = _train_step(ddp_model, optimizer, x.to(device), y.to(device), config)
            _record(history, step, loss, index, model)
            if checkpoint is not None:
                save_position(checkpoint, model, optimizer, epoch, batch + 1)
            if step == stop_after:
                return history
    return history


def loader_generator(seed: int, epoch: int, rank: int) -> torch.Generator:
    """The loader's own generator, seeded from (seed, epoch, rank): each rank's workers, in
    each epoch, get other seeds (worker i seeds with the iterator's base seed + i), and a
    resumed run rebuilds the same one for the same epoch and rank."""
    mixed = ((seed * 1_000_003 + epoch) * 1_000_033 + rank) % 2**63
    return torch.Generator().manual_seed(mixed)


def worker_base_seeds(seed: int, epochs: int, world_size: int) -> dict:
    """The base seed each (epoch, rank) loader's iterator draws for its workers from
    ``loader_generator``, as ``_BaseDataLoaderIter.__init__`` draws it
    (torch/utils/data/dataloader.py)."""
    return {(epoch, rank): iter(DataLoader(range(4),
                                           generator=loader_generator(seed, epoch, rank)))._base_seed
            for epoch in range(epochs) for rank in range(world_size)}


def _train_step(ddp_model, optimizer, x, y, config: EpochConfig) -> float:
    optimizer.zero_grad()
    noisy = x + config.noise * torch.randn(x.shape).to(x.device)
    loss = nn.functional.mse_loss(ddp_model(noisy), y)
    loss.backward()
    optimizer.step()
    return loss.item()


def _record(history: dict, step: int, loss: float, index, model) -> None:
    history["steps"].append(step)
    history["losses"].append(loss)
    history["samples"].append(index.tolist())
    history["weights"].append(flat_params(model))


def iterator_moves_global_rng() -> dict:
    """Whether starting a DataLoader iterator (no workers) advances the global torch
    generator: by default, and with a generator of the loader's own."""
    moved = {}
    for how, generator in (("default", None), ("own generator", torch.Generator())):
        before = torch.get_rng_state()
        iter(DataLoader(range(4), generator=generator))
        moved[how] = not torch.equal(before, torch.get_rng_state())
    return moved


def stop_and_resume(folder, stop_after: int = 6, config: EpochConfig = EpochConfig(),
                    world_size: int = 2) -> dict:
    """Four runs: uninterrupted; stopped after global step ``stop_after`` (mid-epoch);
    resumed from that checkpoint; resumed from a copy without restoring the generators.
    Returns every rank's history of each."""
    import ddp_lab

    def launch(*args, **kwargs):
        return ddp_lab.run(train_epochs, world_size=world_size, args=(config, *args),
                           kwargs=kwargs, echo=False).values

    path, copy = Path(folder) / "midepoch.pt", Path(folder) / "midepoch_copy.pt"
    runs = {"uninterrupted": launch(), "first part": launch(path, stop_after)}
    shutil.copy(path, copy)
    runs["resumed"] = launch(path)
    runs["resumed, no RNG state"] = launch(copy, restore_rng=False)
    return runs
