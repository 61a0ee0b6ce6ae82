"""Live ranks: a failure that is the same on every rank is told once, "on every rank",
with no root-cause rank; a root cause is named only where ranks differ (issue 42, item 7).
One-shot runs share the verdict (verdict/everywhere.py)."""

from __future__ import annotations

import pytest
import torch

import ddp_lab

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def ranks():
    with ddp_lab.Ranks(world_size=4, timeout=20, echo=False) as live:
        yield live


def _failure(call) -> ddp_lab.WorkerError:
    with pytest.raises(ddp_lab.WorkerError) as caught:
        call()
    return caught.value


def _told_once(err: ddp_lab.WorkerError, error_type: str) -> str:
    message = str(err)
    assert message.startswith("every rank raised the same exception, so no rank is the root "
                              f"cause: the same {error_type} on each."), message
    assert message.count("Traceback (most recent call last)") == 1
    assert "it is the root cause" not in message and "as well" not in message
    assert err.knock_on == {} and err.also_failed == {} and err.session == "kept"
    return message


def test_pulling_a_name_no_rank_has_is_one_error_on_every_rank(ranks):
    err = _failure(lambda: ranks.pull("does_not_exist"))
    assert err.same_on == [0, 1, 2, 3]
    assert "name 'does_not_exist' is not defined" in _told_once(err, "NameError")


def test_a_typo_in_a_cell_is_one_error_on_every_rank(ranks):
    err = _failure(lambda: ranks.exec("prnt(rank)"))
    assert err.same_on == [0, 1, 2, 3] and "prnt(rank)" in _told_once(err, "NameError")


def test_a_message_that_names_the_rank_is_still_the_same_error(ranks):
    err = _failure(lambda: ranks.exec("raise ValueError(f'rank {rank} has no data')"))
    assert err.same_on == [0, 1, 2, 3] and "ValueError: rank 0 has no data" in \
        _told_once(err, "ValueError")


def test_the_ranks_a_call_went_to_are_every_rank_of_it(ranks):
    err = _failure(lambda: ranks.pull("does_not_exist", on=[0, 2]))
    assert err.same_on == [0, 2]
    assert str(err).startswith("every rank it ran on (ranks 0, 2) raised the same exception")


@pytest.mark.parametrize("source, root", [("x = 1 / 0 if rank == 3 else 1", 3),
                                          ("raise [ValueError, KeyError][rank % 2]('x')", None)])
def test_a_root_cause_is_named_only_where_ranks_differ(ranks, source, root):
    err = _failure(lambda: ranks.exec(source))
    assert err.same_on == [] and "raised an exception; it is the root cause" in str(err)
    if root is not None:
        assert err.rank == root and err.also_failed == {}
    else:
        assert len(err.also_failed) == 3
    assert ranks.exec("rank").values == [0, 1, 2, 3]  # the session goes on


def test_a_one_shot_run_failing_the_same_everywhere_is_told_once():
    def missing_name():
        return undefined_in_ranks  # noqa: F821
    with pytest.raises(ddp_lab.WorkerError) as caught:
        ddp_lab.run(missing_name, world_size=3, echo=False)
    err = caught.value
    assert err.same_on == [0, 1, 2] and err.also_failed == {} and err.knock_on == {}
    assert str(err).startswith("every rank failed the same way (exit code 1), so no rank is "
                               "the root cause: the same NameError on each.")
    assert torch.distributed.is_available()
