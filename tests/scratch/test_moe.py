"""scratch.MoE with its experts split over 1-4 real ranks against the same layer (same seed)
on one process with every expert: outputs, expert gradients, the router's gradient summed
over the ranks, the counts of dropped tokens and the load-balancing loss."""

from __future__ import annotations

import pytest
import torch

import ddp_lab
from ddp_lab import scratch

pytestmark = pytest.mark.timeout(180)

D_MODEL, D_HIDDEN, EXPERTS, TOKENS = 8, 16, 4, 12


def batch(rank: int) -> torch.Tensor:
    return torch.randn(TOKENS, D_MODEL, generator=torch.Generator().manual_seed(10 + rank))


def expert_parallel(top_k: int, capacity_factor) -> dict:
    import torch.distributed as dist
    torch.manual_seed(0)
    moe = scratch.MoE(D_MODEL, D_HIDDEN, EXPERTS, top_k=top_k, capacity_factor=capacity_factor)
    out = moe(batch(dist.get_rank()))
    (out.square().sum() + moe.aux_loss).backward()
    router_grad = moe.router.weight.grad.clone()
    dist.all_reduce(router_grad)
    return {"out": out.detach(), "router_grad": router_grad, "dropped": moe.stats.dropped,
            "aux": moe.aux_loss.item(),
            "expert_grads": {moe.first_expert + i: [p.grad for p in e.parameters()]
                             for i, e in enumerate(moe.experts)}}


def one_process(world: int, top_k: int, capacity_factor) -> dict:
    """The reference: one process with every expert, each rank's batch in turn."""
    result = ddp_lab.run(_reference, 1, args=(world, top_k, capacity_factor), echo=False)
    return result.values[0]


def _reference(world, top_k, capacity_factor):
    torch.manual_seed(0)
    moe = scratch.MoE(D_MODEL, D_HIDDEN, EXPERTS, top_k=top_k, capacity_factor=capacity_factor)
    outs, dropped, aux = [], [], []
    for rank in range(world):
        out = moe(batch(rank))
        (out.square().sum() + moe.aux_loss).backward()
        outs.append(out.detach())
        dropped.append(moe.stats.dropped)
        aux.append(moe.aux_loss.item())
    return {"outs": outs, "dropped": dropped, "aux": aux, "router_grad": moe.router.weight.grad,
            "expert_grads": {e: [p.grad for p in m.parameters()] for e, m in enumerate(moe.experts)}}


@pytest.mark.parametrize("world", [1, 2, 4])
@pytest.mark.parametrize("top_k, capacity_factor", [(2, None), (1, 1.0), (2, 0.75)])
def test_expert_parallel_equals_one_process_with_every_expert(world, top_k, capacity_factor):
    want = one_process(world, top_k, capacity_factor)
    got = ddp_lab.run(expert_parallel, world, args=(top_k, capacity_factor), echo=False).values
    if capacity_factor is not None and capacity_factor < 1:
        assert sum(want["dropped"]) > 0
    for rank, g in enumerate(got):
        torch.testing.assert_close(g["out"], want["outs"][rank])
        torch.testing.assert_close(g["router_grad"], want["router_grad"])
        assert g["dropped"] == want["dropped"][rank]
        assert g["aux"] == pytest.approx(want["aux"][rank])
        for e, grads in g["expert_grads"].items():
            torch.testing.assert_close(grads, want["expert_grads"][e], msg=f"expert {e}")
    assert sorted(e for g in got for e in g["expert_grads"]) == list(range(EXPERTS))


def test_capacity_keeps_first_choices_first():
    from ddp_lab.scratch.moe import keep_within_capacity
    expert_of = torch.tensor([[0, 1], [0, 1], [1, 0]])   # token 2's first choice is expert 1
    keep = keep_within_capacity(expert_of, 2, capacity=2)
    assert keep.tolist() == [[True, True], [True, False], [True, False]]


def _three_experts():
    try:
        scratch.MoE(4, 4, 3)
    except ValueError as err:
        return str(err)


def test_experts_that_do_not_split_are_refused():
    assert "3 experts do not split over 2 ranks" in ddp_lab.run(_three_experts, 2, echo=False)[0]


def _moe_in_subgroups():
    """Ranks {0, 1} and {2, 3}: two expert-parallel layers, 2 experts per rank each."""
    import torch.distributed as dist
    groups = [dist.new_group([0, 1]), dist.new_group([2, 3])]
    group = groups[dist.get_rank() // 2]
    torch.manual_seed(0)
    moe = scratch.MoE(D_MODEL, D_HIDDEN, EXPERTS, top_k=2, group=group)
    out = moe(batch(dist.get_rank(group)))
    return {"out": out.detach(), "first_expert": moe.first_expert}


def test_expert_parallel_in_a_group_of_its_own():
    want = one_process(2, 2, None)
    got = ddp_lab.run(_moe_in_subgroups, 4, echo=False).values
    for rank, g in enumerate(got):
        torch.testing.assert_close(g["out"], want["outs"][rank % 2])
        assert g["first_expert"] == 2 * (rank % 2)
