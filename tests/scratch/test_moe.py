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


def _built_experts():
    """This rank's experts' weights, and whether the global RNG after the build is where one
    process's build leaves it."""
    import torch.distributed as dist
    torch.manual_seed(0)
    moe = scratch.MoE(D_MODEL, D_HIDDEN, EXPERTS, top_k=2)
    return {"weights": {moe.first_expert + i: [p.detach().clone() for p in e.parameters()]
                        for i, e in enumerate(moe.experts)},
            "router": moe.router.weight.detach().clone(), "next": torch.rand(3),
            "built": [moe.first_expert + i for i in range(len(moe.experts))],
            "rank": dist.get_rank()}


@pytest.mark.parametrize("world", [2, 4])
def test_each_rank_builds_only_its_experts_with_one_process_weights(world):
    """Per-expert seeds: a rank builds its own experts only, with the same weights a one-process
    build gives them, and the global RNG moves on the same way on every number of ranks."""
    [want] = ddp_lab.run(_built_experts, 1, echo=False).values
    got = ddp_lab.run(_built_experts, world, echo=False).values
    for g in got:
        assert len(g["built"]) == EXPERTS // world
        torch.testing.assert_close(g["router"], want["router"], rtol=0, atol=0)
        torch.testing.assert_close(g["next"], want["next"], rtol=0, atol=0)
        for e, weights in g["weights"].items():
            torch.testing.assert_close(weights, want["weights"][e], rtol=0, atol=0)


def test_experts_are_built_one_at_a_time():
    """Building the layer never constructs an expert another rank holds."""
    assert ddp_lab.run(_count_builds, 2, echo=False).values == [EXPERTS // 2, EXPERTS // 2]


def _count_builds():
    from unittest import mock

    from ddp_lab.scratch import moe as moe_module
    calls = []
    real = moe_module._expert

    def counting(*args):
        calls.append(args)
        return real(*args)
    with mock.patch.object(moe_module, "_expert", counting):
        torch.manual_seed(0)
        scratch.MoE(D_MODEL, D_HIDDEN, EXPERTS, top_k=2)
    return len(calls)


def test_aux_loss_is_one_when_either_share_or_probability_is_uniform():
    from ddp_lab.scratch.moe import switch_aux_loss
    g = torch.Generator().manual_seed(0)
    n = 4
    skewed = torch.softmax(3 * torch.randn(6, n, generator=g), -1)
    uniform_p = torch.full((6, n), 1 / n)
    uneven = torch.tensor([7, 3, 2, 0])
    even = torch.tensor([3, 3, 3, 3])
    assert switch_aux_loss(uniform_p, uneven, 2).item() == pytest.approx(1)   # P uniform
    assert switch_aux_loss(skewed, even, 2).item() == pytest.approx(1)        # f uniform
    # under imbalance it can fall below 1 (the review's top-1 example): f=(2/3,1/3)
    probs = torch.tensor([[0.51, 0.49], [0.51, 0.49], [0.01, 0.99]])
    below = switch_aux_loss(probs, torch.tensor([2, 1]), 1).item()
    assert below == pytest.approx(2 * (2 / 3 * 1.03 / 3 + 1 / 3 * 1.97 / 3)) and below < 1
    # its gradient in P_e is n * f_e
    p_mean = skewed.mean(0).requires_grad_()
    rows = p_mean.expand(6, n)   # every token with probabilities P: mean(0) is P again
    switch_aux_loss(rows, uneven, 2).backward()   # 12 assignments of 6 tokens, top-2
    torch.testing.assert_close(p_mean.grad, n * uneven / uneven.sum())


def _empty_rank():
    import torch.distributed as dist
    torch.manual_seed(0)
    moe = scratch.MoE(D_MODEL, D_HIDDEN, EXPERTS, top_k=2, capacity_factor=1.0)
    x = batch(0) if dist.get_rank() == 0 else torch.zeros(0, D_MODEL)
    out = moe(x)
    (out.square().sum() + moe.aux_loss).backward()
    return {"aux": moe.aux_loss.item(),
            "finite": all(bool(torch.isfinite(p.grad).all()) for p in moe.parameters() if p.grad is not None)}


def test_a_rank_without_tokens_has_zero_aux_loss_not_nan():
    got = ddp_lab.run(_empty_rank, 2, echo=False).values
    assert got[1]["aux"] == 0.0 and got[0]["aux"] > 0
    assert got[0]["finite"] and got[1]["finite"]


def _under_ddp(how: str) -> str:
    """scratch.MoE inside DDP: over the ranks that hold different experts (``"all"``), with
    the experts' names given to DDP to ignore (``"router only"``), or over the dp group of a
    (dp 2, ep 2) mesh (``"dp"``, where each DDP group holds one copy of the same experts)."""
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP
    torch.manual_seed(0)
    group = ddp_group = None
    if how == "dp":
        mesh = dist.init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "ep"))
        group, ddp_group = mesh.get_group("ep"), mesh.get_group("dp")
    model = torch.nn.Sequential(torch.nn.Linear(D_MODEL, D_MODEL),
                                scratch.MoE(D_MODEL, D_HIDDEN, EXPERTS, group=group))
    if how == "router only":
        names = [name for name, _ in model.named_parameters() if ".experts." in name]
        DDP._set_params_and_buffers_to_ignore_for_model(model, names)
    wrapped = DDP(model, process_group=ddp_group)
    try:
        wrapped(batch(dist.get_rank())).square().sum().backward()
    except RuntimeError as err:
        return str(err)
    return "ran"


def test_ddp_over_ranks_with_different_experts_is_refused_on_every_rank():
    # Before the check DDP accepted it and every rank ran on rank 0's experts (in-project
    # review IP-13-1, docs/reviews/repro/13_ddp_over_experts.py): this returned "ran".
    for message in ddp_lab.run(_under_ddp, world_size=2, args=("all",), echo=False).values:
        assert "has already copied rank 0's experts over every rank's" in message, message
        assert "_set_params_and_buffers_to_ignore_for_model" in message


@pytest.mark.parametrize("how, world", [("router only", 2), ("dp", 4)])
def test_ddp_that_leaves_the_experts_alone_runs(how, world):
    assert ddp_lab.run(_under_ddp, world_size=world, args=(how,), echo=False).values == ["ran"] * world
