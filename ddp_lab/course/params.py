"""Parameter helpers the DDP chapters share: compare models rank by rank, pick device_ids."""

from __future__ import annotations

import torch
import torch.nn as nn


def device_ids(device: torch.device) -> list[int] | None:
    """DDP's ``device_ids``: this rank's one GPU, or None for a CPU (or multi-device)
    module, where DDP refuses a device list."""
    return [device.index] if device.type == "cuda" else None


def flat_params(model: nn.Module) -> torch.Tensor:
    """Every parameter in one 1-D CPU tensor, so ranks can be compared value by value."""
    return torch.cat([p.detach().cpu().flatten() for p in model.parameters()])


def flat_grads(model: nn.Module) -> torch.Tensor:
    """Every gradient in one 1-D CPU tensor, in ``parameters()`` order."""
    return torch.cat([p.grad.detach().cpu().flatten() for p in model.parameters()])
