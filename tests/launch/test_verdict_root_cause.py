"""Each failure names its true cause and its rank, and a run with no collective never fails.

The functions are defined as a notebook cell defines them (in a ``__main__`` the ranks cannot
import), so they travel by value as a learner's do.
"""

from __future__ import annotations

import pytest

import ddp_lab
from repeats import runs as repeat_count

pytestmark = pytest.mark.timeout(120)

CELL = '''
import os, sys, threading
import torch
import torch.distributed as dist

def no_collective():
    return dist.get_rank()

class Unprintable(Exception):
    def __str__(self):
        raise AttributeError("no attribute 'detail'")

def raise_unprintable_on(rank):
    if dist.get_rank() == rank:
        raise Unprintable("disk 3")
    return dist.get_rank()

def return_lock_on(rank):
    return threading.Lock() if dist.get_rank() == rank else dist.get_rank()

def return_rank_only_object_on(rank, folder):
    if dist.get_rank() != rank:
        return dist.get_rank()
    sys.path.insert(0, folder)
    import rank_only_module
    return rank_only_module.Thing()

def os_exit_on(rank):
    if dist.get_rank() == rank:
        os._exit(0)
    dist.all_reduce(torch.ones(1))
'''
# 100 runs in CI (tests/repeats.py), about 30 s on 2 cores; DDP_LAB_NO_COLLECTIVE_RUNS=N or
# DDP_LAB_SOAK=1 (1000 runs) for a longer look
NO_COLLECTIVE_RUNS = repeat_count("DDP_LAB_NO_COLLECTIVE_RUNS")


@pytest.fixture(scope="module")
def cell():
    namespace = {"__name__": "__main__"}
    exec(compile(CELL, "<notebook cell>", "exec"), namespace)
    return namespace


@pytest.mark.slow
@pytest.mark.timeout(60 + 3 * NO_COLLECTIVE_RUNS)
def test_a_function_without_collectives_never_fails(cell):
    """A rank that returns at once must not break a peer still connecting its gloo mesh."""
    failures = []
    for _ in range(NO_COLLECTIVE_RUNS):
        try:
            assert ddp_lab.run(cell["no_collective"], world_size=4, echo=False).values == \
                [0, 1, 2, 3]
        except ddp_lab.DistributedRunError as exc:
            failures.append(str(exc).splitlines()[0])
    assert not failures, f"{len(failures)} of {NO_COLLECTIVE_RUNS} runs failed: {failures[:3]}"


def test_an_exception_whose_str_raises_is_named(cell):
    with pytest.raises(ddp_lab.WorkerError) as caught:
        ddp_lab.run(cell["raise_unprintable_on"], world_size=3, args=(1,), echo=False)
    err = caught.value
    assert (err.rank, err.exitcode) == (1, 1)
    assert "Unprintable('disk 3') (its message could not be formatted" in err.traceback
    assert "in raise_unprintable_on" in err.traceback


def test_a_return_value_that_cannot_be_pickled_is_named(cell):
    with pytest.raises(ddp_lab.WorkerError) as caught:
        ddp_lab.run(cell["return_lock_on"], world_size=2, args=(1,), echo=False)
    assert caught.value.rank == 1
    assert "cannot be sent back to the caller" in str(caught.value)
    assert "send plain data" in str(caught.value)


def test_a_return_value_that_cannot_be_unpickled_names_its_rank(cell, tmp_path):
    (tmp_path / "rank_only_module.py").write_text("class Thing:\n    pass\n")
    with pytest.raises(ddp_lab.DistributedRunError) as caught:
        ddp_lab.run(cell["return_rank_only_object_on"], world_size=3,
                    args=(1, str(tmp_path)), echo=False)
    err = caught.value
    assert err.rank == 1 and err.values == [0, None, 2]
    assert "No module named 'rank_only_module'" in str(err) and "plain data" in str(err)


def test_a_rank_that_calls_os_exit_is_the_root_cause(cell):
    with pytest.raises(ddp_lab.WorkerError) as caught:
        ddp_lab.run(cell["os_exit_on"], world_size=3, args=(2,), echo=False)
    err = caught.value
    assert (err.rank, err.exitcode) == (2, 0) and sorted(err.knock_on) == [0, 1]
    assert str(err).startswith("rank 2 left the run early")
    assert "Rank 2 ended before fn returned" in str(err)
