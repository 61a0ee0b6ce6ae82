"""The small models the course trains; defined once so every demo means the same thing."""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

import torch
import torch.nn as nn


@dataclass(frozen=True)
class MLPConfig:
    """A stack of Linear layers (ReLU between them): ``depth`` layers in all, ``width``
    features inside, ``inputs`` in and ``outputs`` out. Chapter 07 times and buckets it,
    chapter 10 shards it, chapter 11 splits it over tensor-parallel ranks."""

    inputs: int = 64
    width: int = 256
    depth: int = 4
    outputs: int = 1

    def layer_shapes(self) -> list[tuple[int, int]]:
        sizes = [self.inputs] + [self.width] * (self.depth - 1) + [self.outputs]
        return list(zip(sizes[:-1], sizes[1:]))

    @property
    def parameters(self) -> int:
        return sum(i * o + o for i, o in self.layer_shapes())


def make_mlp(config: MLPConfig, seed: int = 0, names: bool = True) -> nn.Sequential:
    """The same weights on every rank and in a single-process reference (seeded).

    ``names=True``: layers named fc0, act0, fc1, ... so DDP's buckets read like the model;
    ``names=False``: indices 0, 1, 2, ... (what ``parallelize_module`` plans and FSDP's
    state dicts name). The weights are the same either way."""
    torch.manual_seed(seed)
    layers = []
    for k, (fan_in, fan_out) in enumerate(config.layer_shapes()):
        layers.append((f"fc{k}", nn.Linear(fan_in, fan_out)))
        if k < config.depth - 1:
            layers.append((f"act{k}", nn.ReLU()))
    if names:
        return nn.Sequential(OrderedDict(layers))
    return nn.Sequential(*(layer for _, layer in layers))


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
