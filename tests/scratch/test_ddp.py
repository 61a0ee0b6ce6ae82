"""scratch.DDP's buckets are torch's: the same assignment as the Reducer's own
``dist._compute_bucket_assignment_by_size`` on the reversed parameters, one dtype per bucket.
Its guards, on real ranks: a forgotten sync_gradients() and a second backward are errors,
no_sync() accumulates. (Its training against torch's DistributedDataParallel on 1-4 ranks,
with frozen, unused and float16 parameters, is the capstone's check, run on the reference
in tests/exercises/test_notebook_cells.py.)"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from torch import nn

import ddp_lab
from ddp_lab import scratch
from ddp_lab.scratch import DDP

pytestmark = pytest.mark.timeout(180)


def mlp(width: int, depth: int) -> nn.Sequential:
    layers = []
    for _ in range(depth):
        layers += [nn.Linear(width, width), nn.Tanh()]
    return nn.Sequential(*layers)


def torchs_buckets(params, bucket_mb) -> list[list[int]]:
    indices, _ = dist._compute_bucket_assignment_by_size(list(reversed(params)),
                                                         [int(bucket_mb * 2 ** 20)])
    return [[len(params) - 1 - i for i in bucket] for bucket in indices]


def ours(params, bucket_mb) -> list[list[int]]:
    index = {id(p): i for i, p in enumerate(params)}
    return [[index[id(p)] for p in bucket] for bucket in DDP.plan_buckets(params, bucket_mb)]


@pytest.mark.parametrize("width, depth, bucket_mb", [(8, 3, 0.0001), (16, 4, 0.0006),
                                                     (64, 6, 0.02), (32, 2, 25)])
def test_buckets_are_the_reducers(width, depth, bucket_mb):
    params = list(mlp(width, depth).parameters())
    assert ours(params, bucket_mb) == torchs_buckets(params, bucket_mb)


@pytest.mark.parametrize("bucket_mb", [0.0001, 0.0004, 0.002, 25])
def test_one_dtype_per_bucket_as_the_reducer(bucket_mb):
    model = mlp(16, 4)
    model[2].double()
    model[4].half()
    params = list(model.parameters())
    buckets = DDP.plan_buckets(params, bucket_mb)
    assert ours(params, bucket_mb) == torchs_buckets(params, bucket_mb)
    assert all(len({p.dtype for p in bucket}) == 1 for bucket in buckets)


def test_without_bucket_mb_every_parameter_is_its_own_bucket_last_first():
    params = list(mlp(4, 2).parameters())
    buckets = DDP.plan_buckets(params, None)
    assert [[id(p) for p in b] for b in buckets] == [[id(p)] for p in reversed(params)]


def _guards(bucket_mb) -> dict:
    """What scratch.DDP says to a forgotten sync_gradients() and a second backward, and what
    no_sync() accumulates next to torch's no_sync (every rank a different batch)."""
    from torch.nn.parallel import DistributedDataParallel
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = mlp(4, 2)
    theirs = DistributedDataParallel(mlp(4, 2))
    theirs.module.load_state_dict(model.state_dict())
    ddp = scratch.DDP(model, bucket_mb=bucket_mb)
    x = [torch.randn(3, 4, generator=torch.Generator().manual_seed(rank * 10 + k))
         for k in range(2)]
    found = {}
    ddp(x[0]).sum().backward()
    try:
        ddp(x[1])
    except RuntimeError as error:
        found["forward"] = str(error)
    ddp.sync_gradients()
    loss = ddp(x[1]).sum()
    loss.backward(retain_graph=True)
    try:
        loss.backward()
    except RuntimeError as error:
        found["backward"] = str(error)
    ddp.sync_gradients()
    ddp.module.zero_grad(set_to_none=True)
    with ddp.no_sync():
        ddp(x[0]).sum().backward()
    ddp(x[1]).sum().backward()
    ddp.sync_gradients()
    with theirs.no_sync():
        theirs(x[0]).sum().backward()
    theirs(x[1]).sum().backward()
    found["accumulated"] = [(p.grad, q.grad) for p, q in zip(model.parameters(),
                                                             theirs.module.parameters())]
    return found


@pytest.mark.parametrize("bucket_mb", [None, 0.0001])
def test_a_forgotten_sync_is_an_error_and_no_sync_accumulates(bucket_mb):
    for found in ddp_lab.run(_guards, world_size=2, args=(bucket_mb,), echo=False).values:
        assert "sync_gradients()" in found["forward"] and "no_sync" in found["forward"]
        assert "arrived twice" in found["backward"]
        for mine, torchs in found["accumulated"]:
            torch.testing.assert_close(mine, torchs)
