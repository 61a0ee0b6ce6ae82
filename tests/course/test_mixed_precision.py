"""Notebook 05's mixed-precision section: an overflow on one rank skips the step on every rank."""

from __future__ import annotations

import pytest
import torch

import ddp_lab
from ddp_lab.course.ch05_ddp_basics import mixed_precision
from ddp_lab.course.models import ToyModel

pytestmark = pytest.mark.timeout(120)


def test_an_overflow_on_one_rank_skips_the_same_step_everywhere():
    steps = ddp_lab.run(mixed_precision.overflow_on_one_rank, 3, kwargs={"bad_rank": 2},
                        echo=False).values
    records = [rank[:-1] for rank in steps]
    # rank 2's own fp16 backward overflows at step 1 (a genuine overflow, not an inf in the data)
    assert [r["own_grads_finite"] for r in records[2]] == [True, False, True, True]
    assert all(r[1]["own_grads_finite"] for r in records[:2])
    for rank in records:  # yet every rank saw the inf, skipped, and halved its scale
        assert [r["stepped"] for r in rank] == [True, False, True, True]
        assert [r["scale"] for r in rank] == [65536.0, 32768.0, 32768.0, 32768.0]
        assert {r["forward_dtype"] for r in rank} == {"float16"}
        # autocast leaves the buckets float32: one all-reduce of every parameter's 4 bytes
        assert {tuple(r["all_reduced"]) for r in rank} == {(("float32", 4 * sum(p.numel() for p in ToyModel().parameters())),)}
    assert torch.equal(steps[0][-1]["params"], steps[1][-1]["params"])
    assert torch.equal(steps[0][-1]["params"], steps[2][-1]["params"])


def test_only_fp16_has_a_range_that_needs_a_scale():
    ranges = mixed_precision.ranges()
    assert ranges["float16"] == 65504.0
    assert ranges["bfloat16"] > 1e38 and ranges["float32"] > 1e38
