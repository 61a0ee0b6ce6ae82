"""scratch.ring_attention and scratch.ulysses_attention refuse shards that do not agree, on
every rank and before any K/V or all-to-all is sent (in-project review of notebook 12,
IP-12-1 and IP-12-2). Before the check, one rank in bfloat16 or one rank holding one more
position made gloo abort a process (SIGABRT, "Received data size doesn't match expected
size"), naming neither the dtype nor the shape: these runs would end in a WorkerError."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F

import ddp_lab
from ddp_lab import scratch

pytestmark = pytest.mark.timeout(180)
HOW = {"ring": scratch.ring_attention, "ulysses": scratch.ulysses_attention}


def _attempt(how: str, seqs: list[int], dtypes: list[str], kdtypes: list[str] | None = None) -> str:
    rank = dist.get_rank()
    g = torch.Generator().manual_seed(rank)
    q, k, v = (torch.randn(1, 4, seqs[rank], 8, generator=g) for _ in range(3))
    q, v = q.to(getattr(torch, dtypes[rank])), v.to(getattr(torch, dtypes[rank]))
    k = k.to(getattr(torch, (kdtypes or dtypes)[rank]))
    try:
        out = HOW[how](q, k, v, causal=True)
    except ValueError as err:
        return str(err)
    return f"no error: {out.dtype}"


@pytest.mark.parametrize("how", ["ring", "ulysses"])
def test_one_rank_in_another_dtype_is_refused_on_every_rank(how):
    got = ddp_lab.run(_attempt, world_size=2, args=(how, [8, 8], ["float32", "bfloat16"]),
                      echo=False).values
    for message in got:  # both ranks raise: the run returns, no rank is aborted by gloo
        assert "one dtype on every rank" in message and "['float32', 'bfloat16']" in message, message


@pytest.mark.parametrize("how", ["ring", "ulysses"])
def test_mixed_dtypes_on_one_rank_are_refused_on_every_rank(how):
    got = ddp_lab.run(_attempt, world_size=2,
                      args=(how, [8, 8], ["float32", "float32"], ["float32", "float16"]),
                      echo=False).values
    for message in got:
        assert "one floating dtype" in message and "rank 1 has float32, float16, float32" in message, message


def test_ulysses_refuses_shards_of_different_lengths_on_every_rank():
    got = ddp_lab.run(_attempt, world_size=2, args=("ulysses", [9, 8], ["float32"] * 2),
                      echo=False).values
    for message in got:
        assert "same shard shape and dtype on every rank" in message and "(1, 4, 9, 8)" in message, message


def _ulysses_bf16() -> float:
    rank, world = dist.get_rank(), dist.get_world_size()
    g = torch.Generator().manual_seed(0)
    full = [torch.randn(1, 4, 8 * world, 8, generator=g) for _ in range(3)]
    want = F.scaled_dot_product_attention(*(t.bfloat16() for t in full)).chunk(world, dim=-2)[rank]
    got = scratch.ulysses_attention(*(t.bfloat16().chunk(world, dim=-2)[rank] for t in full))
    return (got.float() - want.float()).abs().max().item()


def test_ulysses_on_one_dtype_everywhere_still_runs():
    assert all(err == 0.0 for err in ddp_lab.run(_ulysses_bf16, world_size=2, echo=False).values)
