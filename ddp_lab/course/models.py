"""The small models the course trains; defined once so every demo means the same thing."""

from __future__ import annotations

import torch.nn as nn


class ToyModel(nn.Module):
    """The model of PyTorch's DDP tutorial: Linear(10,10) - ReLU - Linear(10,5).

    https://pytorch.org/tutorials/intermediate/ddp_tutorial.html
    """

    def __init__(self):
        super().__init__()
        self.net1 = nn.Linear(10, 10)
        self.relu = nn.ReLU()
        self.net2 = nn.Linear(10, 5)

    def forward(self, x):
        return self.net2(self.relu(self.net1(x)))


class ToyMpModel(nn.Module):
    """The DDP tutorial's model-parallel ToyModel: net1 on ``dev0``, net2 on ``dev1``.

    Each DDP rank owns two devices; activations move between them in forward and autograd
    moves the gradients back. On a CPU-only machine both devices are ``"cpu"``: the code path
    is the same, only the copies between devices become no-ops.
    """

    def __init__(self, dev0, dev1):
        super().__init__()
        self.dev0, self.dev1 = dev0, dev1
        self.net1 = nn.Linear(10, 10).to(dev0)
        self.relu = nn.ReLU()
        self.net2 = nn.Linear(10, 5).to(dev1)

    def forward(self, x):
        x = self.relu(self.net1(x.to(self.dev0)))
        return self.net2(x.to(self.dev1))


class DigitsCNN(nn.Module):
    """A small CNN for handwritten digits: 1x8x8 (scikit-learn's digits) or 1x28x28 (MNIST).

    Two 3x3 convolutions, a 2x2 max-pool, then an adaptive average pool to 4x4 so the same
    ~150k parameters fit both image sizes: the course trains on digits offline and the very
    same model on MNIST where the files exist.
    """

    def __init__(self, num_classes: int = 10):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(1, 32, 3, padding=1), nn.ReLU(),
            nn.Conv2d(32, 64, 3, padding=1), nn.ReLU(),
            nn.MaxPool2d(2), nn.AdaptiveAvgPool2d(4))
        self.classifier = nn.Sequential(
            nn.Flatten(), nn.Linear(64 * 4 * 4, 128), nn.ReLU(), nn.Linear(128, num_classes))

    def forward(self, x):
        return self.classifier(self.features(x))
