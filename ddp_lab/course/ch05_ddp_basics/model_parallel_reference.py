"""Notebook 05b, section 4: what the model-parallel DDP step of ``basics.model_parallel_step``
must equal. DDP averages the gradients of the ranks' equal batches, so its SGD step is one
process's step on the ranks' batches together; the split over devices changes where the
numbers live, not what they are."""

from __future__ import annotations

import torch
import torch.nn as nn

from ddp_lab.course.models import ToyMpModel
from ddp_lab.course.params import flat_params


def one_process_step(world_size: int, lr: float = 0.001) -> torch.Tensor:
    """ToyMpModel on the CPU, one SGD step on every rank's batch (drawn as the ranks draw
    them: inputs then labels, seed 1 + rank): the weights DDP's ranks must end with."""
    torch.manual_seed(0)
    model = ToyMpModel("cpu", "cpu")
    inputs, labels = [], []
    for rank in range(world_size):
        torch.manual_seed(1 + rank)
        inputs.append(torch.randn(20, 10))
        labels.append(torch.randn(20, 5))
    loss = nn.MSELoss()(model(torch.cat(inputs)), torch.cat(labels))
    loss.backward()
    with torch.no_grad():
        for p in model.parameters():
            p -= lr * p.grad
    return flat_params(model)
