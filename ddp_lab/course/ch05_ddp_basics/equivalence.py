"""Notebook 05, part 2: DDP on N ranks is the same computation as one process.

N ranks, each with its own N-th of a global batch, average their gradients in backward. With
a loss that is a mean over the batch and equal shard sizes, the average of the N shard means
is the mean over the whole batch, so every step equals a single process's step on the full
batch: the same gradients and, after k optimizer steps, the same weights (up to float
rounding, since the sums are added in a different order). This module runs both and keeps
every step's gradients and weights so the notebook can compare them.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

from ddp_lab.course.params import device_ids, flat_grads, flat_params
from ddp_lab.course.models import ToyModel
from ddp_lab.course.training import rank_device


@dataclass(frozen=True)
class EquivalenceConfig:
    """Global batch 24 splits evenly over 1, 2, 3 and 4 ranks."""

    steps: int = 6
    global_batch: int = 24
    lr: float = 0.1
    seed: int = 0


def global_batches(config: EquivalenceConfig) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """The whole batch of every step, drawn from the config's seed: identical on every
    rank and in the single-process reference."""
    gen = torch.Generator().manual_seed(config.seed + 1)
    return [(torch.randn(config.global_batch, 10, generator=gen),
             torch.randn(config.global_batch, 5, generator=gen)) for _ in range(config.steps)]


def shard(batch: torch.Tensor, rank: int, world_size: int) -> torch.Tensor:
    """Rank ``rank``'s contiguous share of a global batch; shares must be equal, since
    DDP averages shard means with equal weight."""
    if len(batch) % world_size:
        raise ValueError(f"a global batch of {len(batch)} does not split evenly over "
                         f"{world_size} ranks: DDP would average unequal shard means, which "
                         "is not the mean over the batch. Pick a divisible batch size.")
    size = len(batch) // world_size
    return batch[rank * size:(rank + 1) * size]


def ddp_training(config: EquivalenceConfig = EquivalenceConfig()) -> dict:
    """Worker: ``steps`` DDP steps of ToyModel, each rank on its shard of the global batch."""
    rank, world = dist.get_rank(), dist.get_world_size()
    device = rank_device()
    torch.manual_seed(config.seed)
    model = ToyModel().to(device)
    ddp_model = DDP(model, device_ids=device_ids(device))
    shards = [(shard(x, rank, world).to(device), shard(y, rank, world).to(device))
              for x, y in global_batches(config)]
    return {**_train(ddp_model, model, shards, config.lr), "device": str(device)}


def single_process_training(config: EquivalenceConfig = EquivalenceConfig(),
                            device: str = "cpu") -> dict:
    """The reference, no process group at all: the same model and steps on whole batches,
    on ``device`` (the ranks'; built and drawn on the CPU, then moved, as they do)."""
    torch.manual_seed(config.seed)
    model = ToyModel().to(device)
    batches = [(x.to(device), y.to(device)) for x, y in global_batches(config)]
    return _train(model, model, batches, config.lr)


def _train(forward: nn.Module, model: nn.Module, batches, lr: float) -> dict:
    """SGD on ``batches`` through ``forward`` (the DDP wrapper or the model itself),
    recording ``model``'s gradients and weights after every step."""
    optimizer = torch.optim.SGD(forward.parameters(), lr=lr)
    initial, grads, weights = flat_params(model), [], []
    for x, y in batches:
        optimizer.zero_grad()
        nn.functional.mse_loss(forward(x), y).backward()
        grads.append(flat_grads(model))
        optimizer.step()
        weights.append(flat_params(model))
    return {"initial": initial, "grads": grads, "weights": weights}


def max_differences(per_rank: list[dict], reference: dict) -> dict:
    """Per step, the largest |DDP - single process| over every rank and every value."""
    return {key: [max((rank[key][step] - ref).abs().max().item() for rank in per_rank)
                  for step, ref in enumerate(reference[key])]
            for key in ("grads", "weights")}


def compare_world_sizes(world_sizes=(1, 2, 3, 4),
                        config: EquivalenceConfig = EquivalenceConfig()) -> dict:
    """Run DDP at every world size and the single-process reference on the ranks' device;
    assert they agree (``torch.testing.assert_close``: float32 tolerance) and return the
    differences. "reference" is the CPU's, "references" has one per device the ranks used.

    Like with like: with a GPU per rank, "auto" puts the ranks on their GPUs (1 rank on a
    1-GPU machine, say) and the GPU's float32 kernels round differently from the CPU's, so
    a CPU reference would measure the devices, not DDP. On one device, 1 rank is exact:
    cuBLAS, too, gives the same bits for the same call on the same GPU
    (https://docs.nvidia.com/cuda/cublas/#results-reproducibility)."""
    import ddp_lab
    references = {"cpu": single_process_training(config)}
    results = {}
    for n in world_sizes:
        per_rank = ddp_lab.run(ddp_training, world_size=n, args=(config,), echo=False).values
        device = per_rank[0]["device"]  # cuda:0 on rank 0 whenever the ranks have GPUs
        if device not in references:
            references[device] = single_process_training(config, device)
        reference = references[device]
        for rank, got in enumerate(per_rank):
            for key in ("grads", "weights"):
                torch.testing.assert_close(got[key], reference[key],
                                           msg=lambda m: f"{n} ranks, rank {rank}, {key}: {m}")
        results[n] = {"per_rank": per_rank, "device": device,
                      "max_diff": max_differences(per_rank, reference)}
    return {"reference": references["cpu"], "references": references, "world_sizes": results}
