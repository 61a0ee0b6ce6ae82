"""Notebook 10: activation checkpointing under FSDP2 keeps less for backward, all-gathers no
more, and gives the same gradients."""

from __future__ import annotations

import pytest
import torch

import ddp_lab
from ddp_lab.course.ch10_sharding import activation_checkpointing

pytestmark = pytest.mark.timeout(120)


def test_checkpointed_blocks_save_less_and_give_the_same_gradients():
    for rank in ddp_lab.run(activation_checkpointing.with_and_without, 2, echo=False).values:
        plain, checkpointed = rank["plain"], rank["checkpointed"]
        assert checkpointed["saved_bytes"] * 3 < plain["saved_bytes"]
        assert checkpointed["backward"] == plain["backward"]
        for got, want in zip(checkpointed["grads"].values(), plain["grads"].values()):
            assert torch.equal(got, want)
