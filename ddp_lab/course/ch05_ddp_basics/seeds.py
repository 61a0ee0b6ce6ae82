"""Notebook 05, part 3: seeding the random number generators of N processes.

Every rank is its own process with its own generators. Three policies, each run on real
ranks, each judged by four things a rank does with randomness: initialize the model, wrap
it in DDP, draw a dropout mask, and pick a random batch of sample indices.

- ``unseeded``: no seed at all. A fresh process (under torchrun) seeds itself from the OS,
  so every rank, and every run, differs.
- ``same_everywhere``: ``torch.manual_seed(seed)`` on every rank. Reproducible, but every
  rank draws the same random numbers: the same dropout masks, the same "random" samples.
- ``per_rank``: the same seed for the model, then a rank-dependent seed for everything the
  data side draws. Reproducible, one model, independent randomness per rank.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.utils.data import DataLoader, Dataset
from torch.nn.parallel import DistributedDataParallel as DDP

from ddp_lab.course.params import device_ids, flat_params
from ddp_lab.course.models import ToyModel
from ddp_lab.course.training import rank_device

POLICIES = ("unseeded", "same_everywhere", "per_rank")
DATASET_SIZE = 1000  # the data set random batches are picked from


def seed_for_model(policy: str, seed: int) -> None:
    """Before the model is built."""
    if policy == "unseeded":
        # What a fresh process does at start-up: seed from the OS. Called explicitly since
        # ddp_lab's ranks are forks of one server, whose state a fork would inherit.
        torch.seed()
    else:
        torch.manual_seed(seed)


def seed_for_data(policy: str, seed: int, rank: int) -> None:
    """After the model is built: dropout, augmentation and sampling draw from here on."""
    if policy == "per_rank":
        torch.manual_seed(seed + 1 + rank)  # never equal to the model seed, unique per rank


def seeding_experiment(seed: int = 0, batch: int = 8) -> dict:
    """Worker: for each policy, this rank's initial model (before and after DDP), one
    dropout mask over a 4 x 16 activation, and the indices of one random batch."""
    rank, device = dist.get_rank(), rank_device()
    results = {}
    for policy in POLICIES:
        seed_for_model(policy, seed)
        model = ToyModel().to(device)
        before = flat_params(model)
        DDP(model, device_ids=device_ids(device))  # broadcasts rank 0's parameters
        seed_for_data(policy, seed, rank)
        mask = F.dropout(torch.ones(4, 16), p=0.5) > 0
        picks = torch.randperm(DATASET_SIZE)[:batch]
        results[policy] = {"init": before, "wrapped": flat_params(model), "mask": mask,
                           "picks": picks}
    return results


def summarize(runs: list[list[dict]]) -> dict:
    """Per policy, what happened across ranks (first run) and across two runs (rank 0):
    did the ranks start with the same model, end with one after DDP, draw the same dropout
    mask, pick the same samples, and did a second run reproduce the first?"""
    first, second = runs
    summary = {}
    for policy in POLICIES:
        ranks = [r[policy] for r in first]
        summary[policy] = {
            "same init on all ranks": _all_equal([r["init"] for r in ranks]),
            "same model after DDP": _all_equal([r["wrapped"] for r in ranks]),
            "same dropout mask on all ranks": _all_equal([r["mask"] for r in ranks]),
            "same random batch on all ranks": _all_equal([r["picks"] for r in ranks]),
            "second run reproduces the first": all(
                torch.equal(first[0][policy][k], second[0][policy][k]) for k in ranks[0]),
        }
    return summary


def _all_equal(tensors: list[torch.Tensor]) -> bool:
    return all(torch.equal(t, tensors[0]) for t in tensors)


def table(summary: dict) -> str:
    """The summary as a text table: one row per question, one column per policy."""
    questions = list(next(iter(summary.values())))
    width = max(map(len, questions))
    lines = [" " * width + "".join(f"{p:>18}" for p in summary)]
    lines += [q.ljust(width) + "".join(f"{('yes' if summary[p][q] else 'no'):>18}"
                                       for p in summary) for q in questions]
    return "\n".join(lines)


class NumpyDraws(Dataset):
    """Each item is one draw of NumPy's global generator, in whichever process loads it."""

    def __len__(self) -> int:
        return 4

    def __getitem__(self, index: int) -> float:
        return float(np.random.rand())


def numpy_in_workers(seed: int = 0, workers: int = 2) -> list[float]:
    """This rank's NumPy draws from ``workers`` DataLoader workers, one item each, without a
    ``worker_init_fn``. Since torch 1.9 each worker seeds NumPy from its own base seed and
    worker id (``_worker_loop`` and ``_generate_state`` in torch/utils/data/_utils/worker.py),
    and the base seed comes from the loader's generator: seeded per rank here, so the draws
    differ between workers and ranks and repeat from run to run."""
    generator = torch.Generator().manual_seed(seed + dist.get_rank())
    loader = DataLoader(NumpyDraws(), batch_size=1, num_workers=workers, generator=generator)
    return [batch.item() for batch in loader]
