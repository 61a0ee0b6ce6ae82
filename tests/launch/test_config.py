"""What the kernel and the ranks share: the environment a rank starts with, the run folder."""

from __future__ import annotations

from ddp_lab.launch.config import threads_per_rank


def test_threads_per_rank_never_below_one():
    assert threads_per_rank(1000) == 1
    assert threads_per_rank(1) >= 1
