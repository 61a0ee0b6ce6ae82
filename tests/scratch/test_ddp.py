"""scratch.DDP's buckets are torch's: the same assignment as the Reducer's own
``dist._compute_bucket_assignment_by_size`` on the reversed parameters. (Its training,
against torch's DistributedDataParallel on 1-4 ranks, is the capstone's check, run on the
reference in tests/exercises/test_mutations.py.)"""

from __future__ import annotations

import pytest
import torch.distributed as dist
from torch import nn

from ddp_lab.scratch import DDP


def mlp(width: int, depth: int) -> nn.Sequential:
    layers = []
    for _ in range(depth):
        layers += [nn.Linear(width, width), nn.Tanh()]
    return nn.Sequential(*layers)


@pytest.mark.parametrize("width, depth, bucket_mb", [(8, 3, 0.0001), (16, 4, 0.0006),
                                                     (64, 6, 0.02), (32, 2, 25)])
def test_buckets_are_the_reducers(width, depth, bucket_mb):
    params = list(mlp(width, depth).parameters())
    index = {id(p): i for i, p in enumerate(params)}
    ours = [[index[id(p)] for p in bucket] for bucket in DDP.plan_buckets(params, bucket_mb)]
    indices, _ = dist._compute_bucket_assignment_by_size(list(reversed(params)),
                                                         [int(bucket_mb * 2 ** 20)])
    theirs = [[len(params) - 1 - i for i in bucket] for bucket in indices]
    assert ours == theirs


def test_without_bucket_mb_every_parameter_is_its_own_bucket_last_first():
    params = list(mlp(4, 2).parameters())
    buckets = DDP.plan_buckets(params, None)
    assert [[id(p) for p in b] for b in buckets] == [[id(p)] for p in reversed(params)]
