"""Notebooks 12 and 13's chapter code on real ranks: Megatron's sequence parallelism equal
to the unsharded block with the collectives it claims; the differentiable all-gather's
wrong K gradients on gloo and the contiguous fix (a fact about torch 2.13: if torch fixes
it, notebook 12 must say so); torch's context_parallel refused on CPU; the MoE equivalence
run with its one-rank reference group."""

from __future__ import annotations

import pytest
import torch

import ddp_lab
from ddp_lab.course.ch12_sequence import megatron_sp, pitfall, torch_cp
from ddp_lab.course.ch13_experts import equivalence

pytestmark = pytest.mark.timeout(180)


def run(fn, world, *args):
    return ddp_lab.run(fn, world_size=world, args=args, echo=False).values


@pytest.mark.parametrize("world", [2, 4])
def test_sequence_parallel_block_equals_the_unsharded_block(world):
    want = megatron_sp.unsharded()
    got = run(megatron_sp.both, world)
    sp = [r["sequence parallel"] for r in got]
    torch.testing.assert_close(torch.cat([r["out"] for r in sp]), want["out"])
    torch.testing.assert_close(torch.cat([r["x_grad"] for r in sp]), want["x_grad"])
    for r in got:
        torch.testing.assert_close(r["tensor parallel"]["out"], want["out"])
        torch.testing.assert_close(r["sequence parallel"]["norm_grad"], want["norm_grad"])
        # backward meets the reduce-scatter first (its backward all-gathers), then the gather
        assert [c for c, _ in r["sequence parallel"]["backward"]] == ["_allgather_base_",
                                                                      "_reduce_scatter_base_"]
        tp_bytes = sum(b for _, b in r["tensor parallel"]["forward"])
        assert sum(b for _, b in r["sequence parallel"]["forward"]) == tp_bytes


def test_the_differentiable_all_gather_pitfall_and_its_fix():
    reference = pitfall.reference_k_grad()
    for r in run(pitfall.compare, 2):
        mine = reference.chunk(2, dim=-2)[r["rank"]]
        assert (r["plain"]["k_grad"] - mine).abs().max() > 0.1
        torch.testing.assert_close(r["contiguous"]["k_grad"], mine)


def test_context_parallel_is_refused_on_cpu():
    assert "does not have a sharding strategy" in run(torch_cp.attempt, 2)[0]


def test_moe_equivalence_with_a_one_rank_reference_group():
    got = run(equivalence.both, 2, equivalence.MoEConfig())
    one = got[0]["one process"]
    for rank, r in enumerate(got):
        torch.testing.assert_close(r["out"], one["outs"][rank])
        torch.testing.assert_close(r["router_grad"], one["router_grad"])
        for e in r["experts"]:
            torch.testing.assert_close(r["expert_grads"][e], one["expert_grads"][e])
