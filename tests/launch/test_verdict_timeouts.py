"""A collective that timed out names the rank that never joined it, with the ranks that
timed out as its victims (issue 42, item 4): one real run per pattern, and notebook 08's
straggler as it runs there (a torchrun-style script, DDP's gradient all-reduce).

The functions are defined as a notebook cell defines them (in a ``__main__`` the ranks
cannot import), so they travel by value as a learner's do. Each waits in a group with a
2 s timeout; the late rank stays away well past it.
"""

from __future__ import annotations

import pytest

import ddp_lab
from ddp_lab.course.ch08_when_it_breaks import stragglers
from ddp_lab.launch.rank.failure import RankFailure
from ddp_lab.launch.verdict.signs import KNOCK_ON_SIGNS, is_timeout

pytestmark = pytest.mark.timeout(120)

CELL = '''
import os, time
from datetime import timedelta
import torch
import torch.distributed as dist

def short_group():
    return dist.new_group(timeout=timedelta(seconds=2))

def straggler_in_python(late=2):
    group = short_group()
    if dist.get_rank() == late:
        time.sleep(4)
    dist.all_reduce(torch.ones(4), group=group)

def rank_in_another_collective(late=2):
    group, other = short_group(), short_group()
    if dist.get_rank() == late:
        dist.barrier(group=other)
    else:
        dist.all_reduce(torch.ones(4), group=group)

def rank_that_died(late=2):
    if dist.get_rank() == late:
        os._exit(3)
    # 1 s: they must time out within the launcher's grace after a failure (2 s)
    dist.all_reduce(torch.ones(4), group=dist.new_group(timeout=timedelta(seconds=1)))
'''
SLEEP_LINE = 1 + next(n for n, line in enumerate(CELL.splitlines()) if "sleep(4)" in line)
HEADLINE = ("rank 2 never joined the {} that ranks 0, 1, 3 waited in; they timed out "
            "(victims). ")


@pytest.fixture(scope="module")
def cell():
    namespace = {"__name__": "__main__"}
    exec(compile(CELL, "<notebook cell>", "exec"), namespace)
    return namespace


def _verdict(fn) -> ddp_lab.WorkerError:
    with pytest.raises(ddp_lab.WorkerError) as caught:
        ddp_lab.run(fn, world_size=4, timeout=60, echo=False)
    err = caught.value
    assert err.rank == 2 and sorted(err.victims) == [0, 1, 3], str(err)
    assert "Victims (they timed out waiting for rank 2):" in str(err)
    assert "it is the root cause" not in str(err)  # the old verdict blamed a victim so
    return err


def test_a_straggler_in_python_is_the_cause_and_the_ranks_that_timed_out_its_victims(cell):
    err = _verdict(cell["straggler_in_python"])
    message = str(err)
    assert message.startswith(HEADLINE.format("all_reduce") + "It was still in its own code "
                              "when they gave up (straggler_in_python, <notebook cell> line "
                              f"{SLEEP_LINE}): rank 2 is the root cause.\n"), message
    assert f'line {SLEEP_LINE}, in straggler_in_python' in err.traceback  # its stack then
    # a victim gives up with gloo's timeout, or breaks off where it waited with a knock-on
    # when another victim gave up first and closed its connections (as in gate runs here)
    whys = list(err.victims.values())
    assert any("Timed out waiting 2000ms" in why for why in whys), whys
    assert all("Timed out waiting 2000ms" in why or
               any(sign in why.lower() for sign in KNOCK_ON_SIGNS) for why in whys), whys
    # it woke to find them gone, unless the launcher's grace after a failure ran out first
    assert err.hint.startswith(("Rank 2 failed only after they had gone",
                                "Rank 2 was stopped by the launcher after they had gone"))


def test_a_rank_in_another_collective_is_the_cause(cell):
    err = _verdict(cell["rank_in_another_collective"])
    first = str(err).splitlines()[0]
    assert first.startswith(HEADLINE.format("all_reduce") + "It was in barrier (another "
                            "collective)"), first
    assert "in barrier" in err.traceback


def test_a_rank_that_died_is_the_cause(cell):
    err = _verdict(cell["rank_that_died"])
    first = str(err).splitlines()[0]
    assert first.startswith(HEADLINE.format("new_group") + "It had died (exit code 3) before "
                            "they gave up"), first
    assert err.exitcode == 3
    assert all(why.startswith("DistStoreError: wait timeout") for why in err.victims.values())
    assert err.traceback == ""  # os._exit: no Python traceback, and no stack of a dead rank


def test_notebook_08_straggler_names_rank_2_not_rank_0():
    """Notebook 08 section 2: a DDP script whose rank 2 is 1.5 s late against a 1 s
    process-group timeout. Ranks 0 and 1 time out in backward()'s all-reduce."""
    with pytest.raises(ddp_lab.WorkerError) as caught:
        ddp_lab.run_script(stragglers.SCRIPT, world_size=3, timeout=60, echo=False,
                           script_args=stragglers.straggler_args(delay=3.0, steps=1,
                                                                 pg_timeout=1.0))
    err = caught.value
    assert err.rank == 2 and sorted(err.victims) == [0, 1], str(err)
    assert str(err).startswith("rank 2 never joined the gradient all_reduce of DDP's "
                               "backward() that ranks 0, 1 waited in; they timed out "
                               "(victims). It was still in its own code when they gave up "
                               "(timed_steps, straggler.py line ")
    assert "time.sleep(delay)" in str(err).splitlines()[0]


@pytest.mark.parametrize("message, timed_out", [
    ("[gloo/unbound_buffer.cc:78] Timed out waiting 1000ms for recv operation", True),
    ("wait timeout after 1000ms, keys: /default_pg/0//1//cpu//0/2", True),
    ("Watchdog caught collective operation timeout: WorkNCCL(SeqNum=7)", True),
    ("Connection closed by peer [127.0.0.1]:5", False), ("bad batch", False)])
def test_timeouts_are_recognised(message, timed_out):
    assert is_timeout(RankFailure("RuntimeError", message)) is timed_out
    assert not is_timeout(None)


TIMED_OUT = RankFailure("RuntimeError", "Timed out waiting 1000ms for recv operation",
                        'Traceback (most recent call last):\n  File "<cell>", line 4, in f\n'
                        '  File "/site/torch/distributed/distributed_c10d.py", line 3252, '
                        'in all_reduce\nRuntimeError: Timed out waiting 1000ms', 10.0)


def _conclude(tmp_path, ranks, errors, stacks_at_failure=None):
    from ddp_lab.launch.config import LaunchConfig, RunFiles
    from ddp_lab.launch.rank.failure import write_failure
    from ddp_lab.launch.verdict.outcome import conclude
    from ddp_lab.launch.verdict.record import RankRecord, RunRecord
    files = RunFiles(tmp_path)
    for rank, record in errors.items():
        write_failure(files.error(rank), record)
    config = LaunchConfig(world_size=len(ranks), backend="gloo", timeout=30.0, env={})
    records = tuple(RankRecord(r, *how, "") for r, how in enumerate(ranks))
    with pytest.raises(ddp_lab.WorkerError) as caught:
        conclude(RunRecord(config, records, files, 1.0,
                           stacks_at_failure=stacks_at_failure or {}))
    return caught.value


def test_a_rank_killed_with_no_evidence_is_not_blamed(tmp_path):
    """torchrun's agent kills the other workers at once: nothing says where they were, so
    the plain verdict stands rather than a guess."""
    stopped = (-15, 10.5, True)
    err = _conclude(tmp_path, [stopped, (1, 10.0, False), stopped], {1: TIMED_OUT})
    assert err.victims == {} and err.rank == 1


def test_a_stack_in_own_code_makes_the_absent_rank_the_cause(tmp_path):
    stopped = (-9, 12.0, True)
    stack = 'Stack (oldest call first):\n  File "<cell>", line 2, in f\n    time.sleep(5)'
    err = _conclude(tmp_path, [(1, 10.0, False), (1, 10.0, False), stopped],
                    {0: TIMED_OUT, 1: TIMED_OUT}, {2: stack})
    assert err.rank == 2 and sorted(err.victims) == [0, 1] and err.traceback == stack
    assert str(err).startswith("rank 2 never joined the all_reduce that ranks 0, 1 waited in; "
                               "they timed out (victims). It was still in its own code when "
                               "they gave up (f, <cell> line 2: time.sleep(5))")
    assert err.hint.startswith("Rank 2 was stopped by the launcher after they had gone.")
