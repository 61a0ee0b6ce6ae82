"""Notebook 05b, section 2: evaluation loops of unequal length through the DDP wrapper.
A forward broadcasts the buffers only after a grad-enabled forward, so under no_grad only
the first evaluation forward synchronizes (unequal counts finish); with grad enabled every
forward does, and the rank with more batches waits in a broadcast nobody joins."""

import pytest

import ddp_lab
from ddp_lab.course.ch05_ddp_basics import sampling

pytestmark = pytest.mark.timeout(120)


def test_no_grad_evaluation_of_unequal_length_finishes():
    res = ddp_lab.run(sampling.uneven_evaluation, world_size=3, kwargs={"batches": (3, 1, 2)},
                      echo=False)
    assert res.values == [3, 1, 2]


def test_grad_enabled_evaluation_of_unequal_length_hangs_in_forward():
    with pytest.raises(ddp_lab.WorkerTimeout) as caught:
        ddp_lab.run(sampling.uneven_evaluation, world_size=2, kwargs={"grad_enabled": True},
                    echo=False, timeout=8)
    assert caught.value.stuck_ranks == [0, 1]
    assert "ddp_model(torch.randn" in caught.value.stacks[0]   # rank 0: its second forward
    assert "dist.barrier()" in caught.value.stacks[1]          # rank 1: already done
