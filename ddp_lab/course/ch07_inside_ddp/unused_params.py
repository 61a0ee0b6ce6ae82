"""Parameters that get no gradient: ``find_unused_parameters`` and ``static_graph``
(notebook 07).

The Reducer launches a bucket's all-reduce when every gradient in it has arrived. If a
parameter took no part in the forward pass, its gradient never arrives, its bucket never
leaves, and the next iteration finds the previous reduction unfinished: DDP raises an
error at the next forward. ``find_unused_parameters=True`` makes DDP walk the autograd
graph from the outputs after every forward and mark the parameters it cannot reach as
ready (extra work every iteration, plus a collective on the bitmap of used parameters).
``static_graph=True`` promises the set never changes: DDP learns it in the first
iteration and then skips the walk.
"""

from __future__ import annotations

import statistics

import torch
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

from ddp_lab.course.models import MLPConfig, make_mlp
from ddp_lab.course.timing import slowest_rank_seconds

# Many small layers: the graph walk grows with the number of autograd nodes.
DEEP_MODEL = MLPConfig(inputs=32, width=32, depth=48, outputs=1)
OPTIONS = {"default": {}, "find_unused_parameters": {"find_unused_parameters": True},
           "static_graph": {"static_graph": True}}


class TwoHeads(nn.Module):
    """A trunk and two heads; forward uses only head ``a`` (say, a task switched off)."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.trunk, self.head_a, self.head_b = nn.Linear(8, 16), nn.Linear(16, 1), nn.Linear(16, 1)

    def forward(self, x):
        return self.head_a(torch.relu(self.trunk(x)))


def train_two_heads(option: str = "default", iterations: int = 3) -> dict:
    """On each rank: a few steps of TwoHeads wrapped with DDP(**OPTIONS[option]).
    Returns how far it got, the error message if one was raised (caught on the rank, so
    the run itself succeeds), and which parameters ended with a gradient."""
    model = TwoHeads()
    ddp = DDP(model, **OPTIONS[option])
    done, error = 0, None
    try:
        for _ in range(iterations):
            ddp(torch.randn(4, 8)).sum().backward()
            done += 1
    except RuntimeError as exc:
        error = str(exc)
    return {"option": option, "iterations_done": done, "error": error,
            "with_grad": [n for n, p in model.named_parameters() if p.grad is not None]}


def compare_options(options=("find_unused_parameters", "static_graph")) -> list[dict]:
    """``train_two_heads`` with each option, in one launch."""
    return [train_two_heads(option) for option in options]


def option_cost(config: MLPConfig = DEEP_MODEL, batch: int = 32, warmup: int = 3,
                iterations: int = 15) -> dict:
    """On each rank: median step time (ms, slowest rank) of a model that uses all its
    parameters, for each of OPTIONS; the options take turns step by step."""
    x = torch.randn(batch, config.inputs)
    models = {name: DDP(make_mlp(config), **kwargs) for name, kwargs in OPTIONS.items()}
    times = {name: [] for name in models}
    for round_ in range(warmup + iterations):
        for name, ddp in models.items():
            seconds = slowest_rank_seconds(lambda: ddp(x).square().mean().backward())
            if round_ >= warmup:
                times[name].append(seconds)
    return {name: statistics.median(t) * 1e3 for name, t in times.items()}
