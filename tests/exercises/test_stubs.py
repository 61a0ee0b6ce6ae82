"""A stub is recognised from its source, so a shipped notebook's check cells do not fail."""

from __future__ import annotations

import pytest

import ddp_lab.exercises as ex
from ddp_lab.exercises.stubs import is_stub


def stub_ellipsis(tensor):
    """Return every rank's tensor."""
    ...


def stub_raise(tensor):
    raise NotImplementedError("fill me in")


def stub_pass(tensor):
    pass


def attempt(tensor):
    """Looks like a stub at first, then does something."""
    ...
    return [tensor]


def attempt_raising_other(tensor):
    raise ValueError("not a stub: a wrong answer")


@pytest.mark.parametrize("fn", [stub_ellipsis, stub_raise, stub_pass])
def test_stubs_are_recognised(fn):
    assert is_stub(fn)


@pytest.mark.parametrize("fn", [attempt, attempt_raising_other, len, lambda t: t])
def test_attempts_are_not_stubs(fn):
    assert not is_stub(fn)


def test_unknown_exercise_names_the_known_ones():
    with pytest.raises(ValueError, match="names\\(\\) lists them"):
        ex.check("no.such_exercise", attempt)


def test_every_name_is_unique_and_has_a_solution():
    names = ex.names()
    assert len(names) == len(set(names))
    for name in names:
        assert callable(ex.solution(name)), name
        assert not is_stub(ex.solution(name)), f"{name}'s reference solution is a stub"


class StubClass:
    """The capstone's skeleton: every method a stub."""

    def __init__(self, module, bucket_mb=None):
        raise NotImplementedError

    def sync_gradients(self):
        ...


class HalfWrittenClass:
    def __init__(self, module, bucket_mb=None):
        self.module = module

    def sync_gradients(self):
        raise NotImplementedError


def test_a_class_is_a_stub_only_while_every_method_is():
    assert is_stub(StubClass)
    assert not is_stub(HalfWrittenClass)


def test_a_stub_is_not_solved_yet_and_shows_the_hint():
    report = ex.check("00.max_over_ranks", stub_ellipsis)
    assert report.startswith("00.max_over_ranks: not solved yet.") and "ReduceOp.MAX" in report
