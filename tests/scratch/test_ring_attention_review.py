"""scratch.ring_attention after the November 2026 review (notebook 12, R3-12-W2, C1, C2, C3):
the messages a forward and a backward send, the dK/dV hop overlapped with the next block's
compute, float32 accumulators for bfloat16 inputs, shards that do not agree refused on every
rank before any send, and a row whose first block is fully masked."""

from __future__ import annotations

import importlib
from unittest import mock

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F

import ddp_lab
from ddp_lab import scratch
from ddp_lab.course.ch12_sequence import attention
from ddp_lab.course.collective_trace import CollectiveTrace
from ddp_lab.scratch.ring_attention import online_softmax_step, zigzag_shard

pytestmark = pytest.mark.timeout(180)
ring = importlib.import_module("ddp_lab.scratch.ring_attention")
CONFIG = attention.AttentionConfig(batch=1, heads=2, seq=24, head_dim=8)


def _messages(layout: str) -> dict:
    q, k, v, upstream = (attention.shard(t, layout) for t in attention.inputs(CONFIG))
    q, k, v = (t.requires_grad_() for t in (q, k, v))
    with CollectiveTrace(dist.get_world_size()) as fwd:
        out = scratch.ring_attention(q, k, v, causal=True, layout=layout)
    with CollectiveTrace(dist.get_world_size()) as bwd:
        (out * upstream).sum().backward()
    kv_bytes = 2 * k.numel() * 4  # a K/V block, and its float32 gradients
    return {"forward": [c.nbytes for c in fwd.calls if c.name == "send"],
            "backward": [c.nbytes for c in bwd.calls if c.name == "send"], "kv_bytes": kv_bytes}


@pytest.mark.parametrize("world", [2, 3, 4])
def test_backward_sends_2n_minus_1_kv_sized_messages(world):
    for r in ddp_lab.run(_messages, world_size=world, args=("zigzag",), echo=False).values:
        assert r["forward"] == [r["kv_bytes"]] * (world - 1)
        assert len(r["backward"]) == 2 * world - 1  # n-1 K/V shifts, n dK/dV hops
        assert set(r["backward"]) == {r["kv_bytes"]}


def _order_of_events(world: int) -> list:
    """In which order one backward computes blocks ('block'), posts a dK/dV hop ('post') and
    waits for one ('wait'). The inputs are float64, so K/V travel as float64 and only the
    dK/dV blocks (float32 accumulators) are float32."""
    log, grad_works = [], set()
    original_shift, original_wait, original_scores = ring._shift, ring._wait, ring._scores

    def shift(t, group, rank, world):
        incoming, works = original_shift(t, group, rank, world)
        if t.dtype == torch.float32:
            grad_works.update(id(w) for w in works)
            log.append("post")
        return incoming, works

    def wait(works):
        if any(id(w) in grad_works for w in works):
            log.append("wait")
        original_wait(works)

    def scores(*args):
        log.append("block")
        return original_scores(*args)

    q, k, v, upstream = (attention.shard(t).double() for t in attention.inputs(CONFIG))
    q, k, v = (t.requires_grad_() for t in (q, k, v))
    out = scratch.ring_attention(q, k, v)
    with mock.patch.object(ring, "_shift", shift), mock.patch.object(ring, "_wait", wait), \
            mock.patch.object(ring, "_scores", scores):
        (out * upstream).sum().backward()
    return log


def test_each_dkdv_hop_is_waited_for_after_the_next_blocks_compute():
    world = 3
    for log in ddp_lab.run(_order_of_events, world_size=world, args=(world,), echo=False).values:
        assert log.count("post") == world and log.count("wait") == world
        posts = [i for i, e in enumerate(log) if e == "post"]
        waits = [i for i, e in enumerate(log) if e == "wait"]
        for post, wait in zip(posts[:-1], waits[:-1]):  # the last hop has no block after it
            assert post < wait and "block" in log[post:wait], log
        assert waits[-1] == len(log) - 1


def _bf16_errors(world: int, seq: int) -> dict:
    config = attention.AttentionConfig(batch=1, heads=4, seq=seq, head_dim=32)
    full = attention.inputs(config)
    ref_in = [t.clone().requires_grad_() for t in full[:3]]
    ref_out = F.scaled_dot_product_attention(*ref_in, is_causal=True)  # float32 reference
    (ref_out * full[3]).sum().backward()
    want = {"out": ref_out.detach(), **{n: t.grad for n, t in zip("qkv", ref_in)}}

    sdpa_in = [t.to(torch.bfloat16).requires_grad_() for t in full[:3]]
    sdpa_out = F.scaled_dot_product_attention(*sdpa_in, is_causal=True)
    (sdpa_out.float() * full[3]).sum().backward()
    sdpa = {"out": sdpa_out.detach(), **{n: t.grad for n, t in zip("qkv", sdpa_in)}}

    mine = [attention.shard(t, "zigzag").to(torch.bfloat16).requires_grad_() for t in full[:3]]
    out = scratch.ring_attention(*mine, causal=True, layout="zigzag")
    assert out.dtype == torch.bfloat16 and all(t.grad is None for t in mine)
    (out.float() * attention.shard(full[3], "zigzag")).sum().backward()
    got = {"out": out.detach(), **{n: t.grad for n, t in zip("qkv", mine)}}
    assert all(g.dtype == torch.bfloat16 for g in got.values())

    def err(a, b):  # mean relative error against the float32 reference, on this rank's rows
        b = attention.shard(b, "zigzag")
        return ((a.float() - b).abs().mean() / b.abs().mean()).item()

    return {name: (err(got[name], want[name]), err(attention.shard(sdpa[name], "zigzag"), want[name]))
            for name in want}


def test_bf16_ring_is_as_accurate_as_sdpa_in_bf16():
    for r in ddp_lab.run(_bf16_errors, world_size=4, args=(4, 512), echo=False).values:
        for name, (ring_err, sdpa_err) in r.items():
            assert ring_err <= sdpa_err, (name, ring_err, sdpa_err)


def _uneven(lengths: list[int]) -> str:
    n = lengths[dist.get_rank()]
    q = torch.randn(1, 1, n, 4)
    try:
        scratch.ring_attention(q, q, q, causal=True)
    except ValueError as err:
        return str(err)
    return "no error"


def test_shards_of_different_lengths_are_refused_on_every_rank():
    got = ddp_lab.run(_uneven, world_size=2, args=([4, 6],), echo=False).values
    for message in got:  # both ranks raise, before any send: the run returns, nothing is left hanging
        assert "same shard shape on every rank" in message and "(1, 1, 4, 4), (1, 1, 6, 4)" in message


def _odd_zigzag() -> str:
    q = torch.randn(1, 1, 3, 4)
    try:
        scratch.ring_attention(q, q, q, causal=True, layout="zigzag")
    except ValueError as err:
        return str(err)
    return "no error"


def test_an_odd_zigzag_shard_is_refused_on_every_rank():
    got = ddp_lab.run(_odd_zigzag, world_size=2, echo=False).values
    assert all("seq_local=3 is odd" in m for m in got)


def test_zigzag_shard_refuses_a_length_that_does_not_split_into_2n():
    with pytest.raises(ValueError, match="10 positions does not split into 2 x 2 = 4"):
        zigzag_shard(torch.zeros(1, 1, 10, 2), 0, 2)


def test_a_fully_masked_first_block_leaves_no_nan():
    v = torch.randn(3, 2)
    first = torch.full((1, 3), float("-inf"))
    second = torch.tensor([[0.5, -1.0, 2.0]])
    acc, m, l = online_softmax_step(torch.zeros(1, 2), torch.full((1,), float("-inf")), torch.zeros(1),
                                    first, v)
    assert torch.equal(acc, torch.zeros(1, 2)) and torch.equal(l, torch.zeros(1)) and m.isinf().all()
    acc, m, l = online_softmax_step(acc, m, l, second, v)
    torch.testing.assert_close(acc / l.unsqueeze(-1), torch.softmax(second, -1) @ v)


@pytest.mark.parametrize("world, seq", [(3, 48), (4, 64)])
def test_kv_sized_buffers_alive_at_once(world, seq):
    """R3-12-M3: while a block is computed a forward holds two K/V blocks and a backward
    five K/V-sized buffers (two K/V, three float32 dK/dV); at a shift one more, for a
    moment (notebook 12, c23 and the assert cell)."""
    from ddp_lab.course.ch12_sequence import traffic
    config = attention.AttentionConfig(batch=1, heads=2, seq=seq, head_dim=16)
    for r in ddp_lab.run(traffic.ring_messages, world_size=world, args=(config,), echo=False).values:
        assert r["kv_bytes"] == r["grad_kv_bytes"]
        for phase, counts in {"forward": (2, 3), "backward": (5, 6)}.items():
            live = r["live"][phase]
            assert (live["kv_computing"], live["kv_most"]) == counts, (world, phase, live)
            assert live["kv_most"] * r["kv_bytes"] > live["peak"] / 2


def test_live_tensors_counts_storages_until_they_are_freed():
    from ddp_lab.course.ch12_sequence.traffic import LiveTensors
    x = torch.ones(256)  # made before: not counted
    with LiveTensors() as live:
        a = x * 2                         # 1024 B
        b = a[:128]                       # a view: the same storage, not counted again
        c = a + 1                         # 2048 B alive
        del a, b, c                       # freed: 0 B
        d = torch.ones(64, 64) @ torch.ones(64, 64)  # 16384 B each, two ones and the product
    assert live.peak == 3 * 64 * 64 * 4
    assert live.most[1024] == 2 and live.computing[64 * 64 * 4] == 3
    assert live.bytes == 64 * 64 * 4 and d.shape == (64, 64)
