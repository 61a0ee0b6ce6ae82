"""The from-scratch ZeRO-1 (ShardedOptimizer) and ZeRO-3 (FSDP, full_state_dict) against one
process on the global batch, on 1-4 real ranks; what they keep per rank; bad input."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn

import ddp_lab
from ddp_lab import scratch
from ddp_lab.course.ch10_sharding import equivalence
from ddp_lab.scratch.sharded_optimizer import partition

pytestmark = pytest.mark.timeout(180)

SCRATCH = ("ZeRO-1 scratch", "ZeRO-3 scratch")


def run(fn, world_size, *args, **kwargs):
    return ddp_lab.run(fn, world_size=world_size, args=args, kwargs=kwargs, echo=False).values


@pytest.mark.parametrize("world", [1, 2, 3, 4])
def test_scratch_zero1_and_zero3_equal_one_process(world):
    config = equivalence.TrainConfig(steps=3)
    reference = equivalence.reference(config)
    for rank, result in enumerate(run(equivalence.every_variant, world, config, SCRATCH)):
        for name in SCRATCH:
            got = result[name]
            torch.testing.assert_close(got["losses"], reference["losses"], msg=f"{name} rank {rank}")
            torch.testing.assert_close(got["params"], reference["params"], msg=f"{name} rank {rank}")


def _fsdp_facts():
    """What a scratch FSDP holds: shard sizes, whether full weights stay after forward, and
    the error when a step forgets sync_gradients."""
    import torch.distributed as dist
    model = scratch.FSDP(nn.Sequential(nn.Linear(5, 7), nn.ReLU(), nn.Linear(7, 3)))
    out = model(torch.randn(4, 5))
    kept = [getattr(model.module[i], name).numel() for i in (0, 2) for name in ("weight", "bias")]
    out.sum().backward()
    pending = len(model.pending)
    try:
        model(torch.randn(4, 5))
        forgot = None
    except RuntimeError as err:
        forgot = str(err)
    model.sync_gradients()
    full = scratch.full_state_dict(model)
    return {"world": dist.get_world_size(), "shards": [tuple(p.shape) for p in model.parameters()],
            "grads": [tuple(p.grad.shape) for p in model.parameters()], "kept": kept,
            "pending": pending, "forgot": forgot, "full": {k: tuple(v.shape) for k, v in full.items()}}


def test_fsdp_keeps_shards_frees_full_weights_and_asks_for_sync():
    for facts in run(_fsdp_facts, 3):
        # 35, 7, 21, 3 values padded to multiples of 3, then one third each
        assert facts["shards"] == facts["grads"] == [(12,), (3,), (7,), (1,)]
        assert facts["kept"] == [0, 0, 0, 0]           # nothing full between uses
        assert facts["pending"] == 4                    # one reduce-scatter per parameter
        assert "sync_gradients" in facts["forgot"]
        assert facts["full"] == {"0.weight": (7, 5), "0.bias": (7,), "2.weight": (3, 7), "2.bias": (3,)}


def _bf16_training():
    config = equivalence.TrainConfig(steps=3)
    return equivalence.train(equivalence.fsdp_scratch(config, torch.bfloat16), config)


def test_fsdp_bf16_compute_keeps_fp32_shards_and_stays_close():
    config = equivalence.TrainConfig(steps=3)
    reference = equivalence.reference(config)
    for result in run(_bf16_training, 2):
        assert all(v.dtype == torch.float32 for v in result["params"].values())
        torch.testing.assert_close(result["losses"], reference["losses"], atol=0.05, rtol=0.05)
        # Adam moves each parameter by at most lr per step, whatever its gradient: a bf16
        # rounding that flips a tiny gradient's sign costs at most 2 lr per step
        bound = 2 * config.lr * config.steps
        torch.testing.assert_close(result["params"], reference["params"], atol=bound, rtol=0)
        # bf16 matmuls really ran: not the fp32 numbers to the last bit
        assert not all(torch.equal(result["params"][k], v) for k, v in reference["params"].items())


def test_partition_balances_by_size_and_may_leave_ranks_empty():
    assert partition([10, 10, 10, 10], 2) == [0, 1, 0, 1]
    assert partition([100, 1, 1], 2) == [0, 1, 1]
    assert partition([5], 3) == [0]                      # ranks 1 and 2 own nothing


def _more_ranks_than_parameters():
    layer = nn.Linear(3, 2)
    opt = scratch.ShardedOptimizer(layer.parameters(), torch.optim.SGD, lr=0.5)
    layer(torch.ones(1, 3)).sum().backward()
    opt.step()
    return opt.local is None, layer.weight.detach().clone()


def test_sharded_optimizer_with_ranks_that_own_nothing():
    results = run(_more_ranks_than_parameters, 3)
    assert [empty for empty, _ in results] == [False, False, True]
    for _, weight in results[1:]:
        torch.testing.assert_close(weight, results[0][1])


def _bad_inputs():
    errors = []
    for call in (lambda: scratch.ShardedOptimizer([], torch.optim.SGD, lr=1),
                 lambda: scratch.ShardedOptimizer(nn.Linear(2, 2).parameters(), "adam"),
                 lambda: scratch.FSDP(nn.Linear(2, 2), compute_dtype=torch.int8),
                 lambda: scratch.full_state_dict(nn.Linear(2, 2))):
        try:
            call()
        except (TypeError, ValueError) as err:
            errors.append(f"{type(err).__name__}: {err}")
    tied = nn.Sequential(nn.Linear(2, 2), nn.Linear(2, 2))
    tied[1].weight = tied[0].weight
    try:
        scratch.FSDP(tied)
    except ValueError as err:
        errors.append(f"ValueError: {err}")
    return errors


def test_bad_input_is_refused_with_advice():
    errors = run(_bad_inputs, 1)[0]
    assert len(errors) == 5, errors
    assert "model.parameters()" in errors[0] and "torch.optim.Adam" in errors[1]
    assert "bfloat16" in errors[2] and "scratch FSDP" in errors[3] and "tied" in errors[4]


def _frozen_first_layer(steps=3):
    """scratch.FSDP on a model whose first layer is frozen (fine-tuning), 3 Adam steps on this
    rank's rows of each global batch; review IP-10-3: the shards used to be made trainable."""
    import torch.distributed as dist
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 6), nn.ReLU(), nn.Linear(6, 2))
    model[0].requires_grad_(False)
    frozen = {name: p.detach().clone() for name, p in model.named_parameters() if name.startswith("0.")}
    wrapped = scratch.FSDP(model)
    optimizer = torch.optim.Adam(wrapped.parameters(), lr=0.1)
    for step in range(steps):
        g = torch.Generator().manual_seed(step)
        x, y = torch.randn(8, 4, generator=g), torch.randn(8, 2, generator=g)
        nn.functional.mse_loss(wrapped(x.chunk(world)[rank]), y.chunk(world)[rank]).backward()
        reduced = len(wrapped.pending)
        wrapped.sync_gradients()
        optimizer.step()
        optimizer.zero_grad()
    full = scratch.full_state_dict(wrapped)
    return {"requires_grad": [p.requires_grad for p in wrapped.parameters()],
            "reduce-scatters in the last backward": reduced,
            "frozen unchanged": all(torch.equal(full[name], value) for name, value in frozen.items())}


@pytest.mark.parametrize("world", [1, 2])
def test_fsdp_keeps_frozen_parameters_frozen(world):
    for result in run(_frozen_first_layer, world):
        assert result["requires_grad"] == [False, False, True, True]
        assert result["reduce-scatters in the last backward"] == 2     # the trainable layer's only
        assert result["frozen unchanged"]
