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
