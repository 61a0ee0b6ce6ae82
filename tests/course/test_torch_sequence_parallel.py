"""Notebook 12: torch's SequenceParallel styles equal the hand-written block, and the
vocabulary-parallel loss equals one process's without gathering the logits."""

from __future__ import annotations

import pytest
import torch

import ddp_lab
from ddp_lab.course.ch12_sequence import megatron_sp, torch_sp

pytestmark = pytest.mark.timeout(120)


@pytest.mark.parametrize("world_size", [2, 4])
def test_torch_styles_equal_one_process_with_the_same_collectives(world_size):
    ranks = ddp_lab.run(torch_sp.torch_sequence_parallel, world_size, echo=False).values
    reference = megatron_sp.unsharded()
    torch.testing.assert_close(torch.cat([r["out"] for r in ranks]), reference["out"])
    torch.testing.assert_close(torch.cat([r["x_grad"] for r in ranks]), reference["x_grad"])
    torch.testing.assert_close(ranks[0]["norm_grad"], reference["norm_grad"])
    for rank in ranks:  # the all-gather in, the reduce-scatter out; swapped in backward
        assert rank["forward"] == {"all_gather": 1, "reduce_scatter": 1}
        assert rank["backward"] == {"all_gather": 1, "reduce_scatter": 1}
        assert rank["out_placements"] == ["S(0)"]


def test_the_loss_on_sharded_logits_all_reduces_and_never_gathers():
    for rank in ddp_lab.run(torch_sp.vocab_parallel_loss, 3, echo=False).values:
        assert rank["loss"] == pytest.approx(rank["expected"], rel=1e-6)
        assert rank["grad_equal"]
        assert rank["collectives"] == {"all_reduce": 3} and not rank["logits_gathered"]
