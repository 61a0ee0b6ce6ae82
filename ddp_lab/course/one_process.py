"""The single-process reference that the sharded and parallel trainings of notebooks 10 and
11 must reproduce: the whole global batch, one model, one optimizer."""

from __future__ import annotations

import torch.nn as nn


def one_process_training(model: nn.Module, optimizer, batches) -> dict:
    """Train on each ``(x, y)`` of ``batches`` with MSE; the losses and final state dict."""
    losses = []
    for x, y in batches:
        loss = nn.functional.mse_loss(model(x), y)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    return {"losses": losses, "params": {k: v.detach().clone() for k, v in model.state_dict().items()}}
