"""scratch.ring_attention and scratch.ulysses_attention against full attention on one
process: the output shards and the gradients of q, k and v, causal and not, on 1-4 real
ranks (and the zig-zag layout of the ring)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import ddp_lab
from ddp_lab import scratch
from ddp_lab.scratch.ring_attention import zigzag_shard, zigzag_unshard

pytestmark = pytest.mark.timeout(180)

SHAPE = (2, 4, 24, 8)   # batch, heads, whole sequence, head_dim: splits over 1-4 ranks (x2)


def full_attention(causal: bool, seed: int = 0) -> dict:
    g = torch.Generator().manual_seed(seed)
    q, k, v, upstream = (torch.randn(SHAPE, generator=g) for _ in range(4))
    q, k, v = (t.requires_grad_() for t in (q, k, v))
    out = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
    (out * upstream).sum().backward()
    return {"inputs": (q.detach(), k.detach(), v.detach(), upstream), "out": out.detach(),
            "grads": (q.grad, k.grad, v.grad)}


def _shard(t, rank, world, layout):
    if layout == "zigzag":
        return zigzag_shard(t, rank, world)
    return t.chunk(world, dim=-2)[rank]


def sharded(how: str, causal: bool, layout: str = "contiguous") -> dict:
    import torch.distributed as dist
    rank, world = dist.get_rank(), dist.get_world_size()
    q, k, v, upstream = (_shard(t, rank, world, layout).clone()
                         for t in full_attention(causal)["inputs"])
    q, k, v = (t.requires_grad_() for t in (q, k, v))
    if how == "ring":
        out = scratch.ring_attention(q, k, v, causal=causal, layout=layout)
    else:
        out = scratch.ulysses_attention(q, k, v, causal=causal)
    (out * upstream).sum().backward()
    return {"out": out.detach(), "grads": (q.grad, k.grad, v.grad)}


def _gather(shards, layout):
    return zigzag_unshard(shards) if layout == "zigzag" else torch.cat(shards, dim=-2)


@pytest.mark.parametrize("world", [1, 2, 3, 4])
@pytest.mark.parametrize("how, layout", [("ring", "contiguous"), ("ring", "zigzag"),
                                         ("ulysses", "contiguous")])
def test_sequence_parallel_attention_equals_full_attention(world, how, layout):
    if how == "ulysses" and SHAPE[1] % world:
        pytest.skip("heads must divide by the world size")
    for causal in (False, True):
        want = full_attention(causal)
        got = ddp_lab.run(sharded, world_size=world, args=(how, causal, layout), echo=False).values
        torch.testing.assert_close(_gather([g["out"] for g in got], layout), want["out"])
        for i, name in enumerate("qkv"):
            torch.testing.assert_close(_gather([g["grads"][i] for g in got], layout),
                                       want["grads"][i], msg=f"{how} d{name}, causal={causal}")


def test_zigzag_shards_put_back_together():
    x = torch.arange(16.0).reshape(1, 1, 16, 1)
    shards = [zigzag_shard(x, r, 4) for r in range(4)]
    assert shards[0].flatten().tolist() == [0, 1, 14, 15]
    assert torch.equal(zigzag_unshard(shards), x)


def _uneven_heads():
    q = torch.zeros(1, 3, 4, 2)
    try:
        scratch.ulysses_attention(q, q, q)
    except ValueError as err:
        return str(err)


def test_ulysses_refuses_heads_that_do_not_split():
    assert "3 heads do not split over 2 ranks" in ddp_lab.run(_uneven_heads, 2, echo=False)[0]
