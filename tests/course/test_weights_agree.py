"""Notebook 00b's reference ``weights_agree`` compares bits: the same NaN on every rank
agrees (a run that blew up is still in sync), -0.0 against +0.0 does not, and any dtype
works without a wider copy (review R3-00b-C1)."""

from __future__ import annotations

import pytest
import torch

import ddp_lab
from ddp_lab.course.ch00_launching.exercises_b import weights_agree

pytestmark = pytest.mark.timeout(120)


def _agree_after(first: float, others: float, dtype: torch.dtype) -> bool:
    import torch.distributed as dist
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 2).to(dtype)
    with torch.no_grad():
        model.weight[0, 0] = first if dist.get_rank() == 0 else others
    before = model.weight.detach().clone().view(torch.uint8 if dtype.itemsize == 1 else
                                                {2: torch.int16, 4: torch.int32}[dtype.itemsize])
    agree = weights_agree(model)
    after = model.weight.detach().view(before.dtype)
    assert torch.equal(before, after), "the weights changed"
    return agree


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("first, others, expected", [
    (float("nan"), float("nan"), True),   # the same bits: in sync, though NaN != NaN
    (0.0, -0.0, False),                   # == calls them equal; the sign bit differs
    (1.0, 1.0, True),
    (1.0, 2.0, False)])
def test_the_reference_compares_bits(first, others, expected, dtype):
    res = ddp_lab.run(_agree_after, world_size=2, args=(first, others, dtype), echo=False,
                      timeout=60)
    assert res.values == [expected, expected]


SWAPLESS_SEEDS = (1950, 6132, 6421, 9954)  # each drew a trainable tensor of one repeated value


def test_the_swap_trial_always_changes_a_weight():
    """The checker's swap finds two different weights of one tensor on every seed, including
    those whose drawn tensor holds one value (a 2-element bias rounded twice to the same
    multiple of 1/512): it raised StopIteration there, failing a right answer (IP-00b-1)."""
    from ddp_lab.course.ch00_launching.exercises_b import _differ, _model
    torch.set_num_threads(1)
    for seed in (*SWAPLESS_SEEDS, *range(1, 3001)):
        same, swapped = _model(seed), _model(seed)
        where = _differ(swapped, seed, "swap")
        changed = [n for (n, a), b in zip(same.named_parameters(), swapped.parameters())
                   if not torch.equal(a, b)]
        assert len(changed) == 1 and "swapped" in where, (seed, where, changed)
        a = dict(same.named_parameters())[changed[0]].flatten()
        b = dict(swapped.named_parameters())[changed[0]].flatten()
        assert torch.equal(a.sort().values, b.sort().values), (seed, where)  # a swap, no more


def test_the_reference_passes_a_check_whose_swap_meets_a_one_value_tensor(monkeypatch):
    import ddp_lab.course.ch00_launching.exercises_b as eb
    monkeypatch.setattr(eb, "new_seed", lambda: SWAPLESS_SEEDS[0])
    assert "seed 1950" in eb.check_weights_agree(eb.weights_agree)
