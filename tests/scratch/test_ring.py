"""The from-scratch ring (ddp_lab.scratch.ring) against torch's collectives on 1-4 real ranks:
the all-reduce of a tensor that N does not divide, the reduce-scatter of N equal chunks, and
the bytes the all-reduce sends by the ring's design."""

from __future__ import annotations

import math

import pytest
import torch

import ddp_lab

pytestmark = pytest.mark.timeout(120)

NUMEL, CHUNK = 11, 3


def _values(rank: int, numel: int) -> torch.Tensor:
    return torch.randint(-2 ** 40, 2 ** 40, (numel,), generator=torch.Generator().manual_seed(rank))


def _ring_against_torch() -> dict:
    import torch.distributed as dist

    from ddp_lab.scratch.ring import Link, ring_all_reduce, ring_reduce_scatter
    rank, world = dist.get_rank(), dist.get_world_size()
    link, summed = Link(), _values(rank, NUMEL)
    ring_all_reduce(summed, link=link)
    expected = _values(rank, NUMEL)
    dist.all_reduce(expected)
    return {"summed": summed, "expected": expected, "sent": link.bytes_sent,
            "shard": ring_reduce_scatter(_values(rank, CHUNK * world))}


@pytest.mark.parametrize("world", [1, 2, 3, 4])
def test_the_scratch_ring_sums_as_torch_does(world):
    values = ddp_lab.run(_ring_against_torch, world_size=world, echo=False).values
    total = sum(_values(r, CHUNK * world) for r in range(world))
    for rank, result in enumerate(values):
        assert torch.equal(result["summed"], result["expected"])
        assert result["sent"] <= 2 * (world - 1) * math.ceil(NUMEL / world) * 8
        assert torch.equal(result["shard"], total.chunk(world)[rank])


def _uneven_reduce_scatter(shape) -> str:
    from ddp_lab.scratch.ring import ring_reduce_scatter
    try:
        ring_reduce_scatter(torch.arange(math.prod(shape)).reshape(shape))
    except ValueError as err:
        return str(err)
    return "no error"


@pytest.mark.parametrize("shape", [(6,), (10,), (6, 4), ()])
def test_reduce_scatter_refuses_a_dim_0_the_ranks_do_not_divide(shape):
    """6 elements on 4 ranks used to raise an IndexError on two ranks and hang up the other
    two; 10 came back silently cut 3,3,3,1 (ring_all_reduce cuts 3,3,2,2). Every rank now
    raises a ValueError that names the cause, before any send."""
    values = ddp_lab.run(_uneven_reduce_scatter, world_size=4, args=(shape,), echo=False,
                         timeout=30).values
    for message in values:
        assert "does not divide by 4" in message, message
        assert f"shape {shape}" in message, message
