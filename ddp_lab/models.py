"""The small models the course trains; defined once so every demo means the same thing."""

from __future__ import annotations

import torch.nn as nn


class ToyModel(nn.Module):
    """The model of PyTorch's DDP tutorial (seeds 002, 004): Linear(10,10) - ReLU - Linear(10,5)."""

    def __init__(self):
        super().__init__()
        self.net1 = nn.Linear(10, 10)
        self.relu = nn.ReLU()
        self.net2 = nn.Linear(10, 5)

    def forward(self, x):
        return self.net2(self.relu(self.net1(x)))
