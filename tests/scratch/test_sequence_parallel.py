"""scratch.ring_attention and scratch.ulysses_attention against full attention on one
process: the output shards and the gradients of q, k and v, causal and not, on 1-4 real
ranks (and the zig-zag layout of the ring)."""

from __future__ import annotations

import pytest
import torch

import ddp_lab
from ddp_lab import scratch
from ddp_lab.course.ch12_sequence import attention
from ddp_lab.scratch.ring_attention import chunks, zigzag_shard, zigzag_unshard

pytestmark = pytest.mark.timeout(180)

# 24 positions split over 1-4 ranks, and into 2n zig-zag chunks; 4 heads for Ulysses.
CONFIG = attention.AttentionConfig(batch=2, heads=4, seq=24, head_dim=8)


def _gather(shards, layout):
    return zigzag_unshard(shards) if layout == "zigzag" else torch.cat(shards, dim=-2)


@pytest.mark.parametrize("world", [1, 2, 3, 4])
@pytest.mark.parametrize("how, layout", [("ring", "contiguous"), ("ring", "zigzag"),
                                         ("ulysses", "contiguous")])
def test_sequence_parallel_attention_equals_full_attention(world, how, layout):
    if how == "ulysses" and CONFIG.heads % world:
        pytest.skip("heads must divide by the world size")
    for causal in (False, True):
        want = attention.full_attention(CONFIG, causal)
        got = ddp_lab.run(attention.sharded, world_size=world, args=(how, causal, CONFIG, layout),
                          echo=False).values
        torch.testing.assert_close(_gather([g["out"] for g in got], layout), want["out"])
        for name in "qkv":
            torch.testing.assert_close(_gather([g["grads"][name] for g in got], layout),
                                       want["grads"][name], msg=f"{how} d{name}, causal={causal}")


def test_zigzag_shards_put_back_together():
    x = torch.arange(16.0).reshape(1, 1, 16, 1)
    shards = [zigzag_shard(x, r, 4) for r in range(4)]
    assert shards[0].flatten().tolist() == [0, 1, 14, 15]
    assert chunks("zigzag", 0, 4, 4) == [(0, 0, 2), (2, 14, 2)]
    assert torch.equal(zigzag_unshard(shards), x)


def test_causal_work_is_even_with_the_zigzag_split():
    from ddp_lab.course.ch12_sequence.balance import work_grid
    contiguous, zigzag = work_grid("contiguous", 4, 8), work_grid("zigzag", 4, 8)
    assert [sum(row) for row in contiguous] == [64, 128, 192, 256]
    assert [sum(row) for row in zigzag] == [144] * 4   # (2n+1)/4 blocks of 8 x 8 each


def _uneven_heads():
    q = torch.zeros(1, 3, 4, 2)
    try:
        scratch.ulysses_attention(q, q, q)
    except ValueError as err:
        return str(err)


def test_ulysses_refuses_heads_that_do_not_split():
    assert "3 heads do not split over 2 ranks" in ddp_lab.run(_uneven_heads, 2, echo=False)[0]


def _in_subgroups(how: str, causal: bool) -> dict:
    """Ranks {0, 1} and {2, 3} each split the sequence over their own group."""
    import torch.distributed as dist
    groups = [dist.new_group([0, 1]), dist.new_group([2, 3])]
    group = groups[dist.get_rank() // 2]
    mine = dist.get_rank(group)
    q, k, v, upstream = (t.chunk(2, dim=-2)[mine].clone() for t in attention.inputs(CONFIG))
    q, k, v = (t.requires_grad_() for t in (q, k, v))
    fn = scratch.ring_attention if how == "ring" else scratch.ulysses_attention
    out = fn(q, k, v, causal=causal, group=group)
    (out * upstream).sum().backward()
    return {"out": out.detach(), "grads": {"q": q.grad, "k": k.grad, "v": v.grad}}


@pytest.mark.parametrize("how", ["ring", "ulysses"])
def test_a_process_group_of_its_own(how):
    want = attention.full_attention(CONFIG, causal=True)
    got = ddp_lab.run(_in_subgroups, world_size=4, args=(how, True), echo=False).values
    for pair in (got[:2], got[2:]):
        torch.testing.assert_close(torch.cat([g["out"] for g in pair], dim=-2), want["out"])
        for name in "qkv":
            torch.testing.assert_close(torch.cat([g["grads"][name] for g in pair], dim=-2),
                                       want["grads"][name])
