"""Every exercise's checker against plausible wrong answers: each must be rejected with a
message that points at the mistake, and names the seed that reproduces it.

The wrong answers (mutants_*.py) are the ones a learner really writes: a closed form, a
sleep for a barrier, the switched-off built-in, an off-by-one rank, the wrong chunk, no
average, no broadcast, an all-reduce after backward. The checkers draw a fresh seed each
time, so these tests also show that a mistake is caught whatever seed they draw. That the
reference solutions pass, as a notebook's solved cell, is test_notebook_cells.py's part.
"""

from __future__ import annotations

import importlib
import re
from pathlib import Path

import pytest
import torch.distributed as dist

import ddp_lab.exercises as ex

pytestmark = [pytest.mark.timeout(240), pytest.mark.usefixtures("warm_fork_server")]

# Every mutants_*.py next to this file (pytest puts this folder on sys.path): a chapter's
# new exercise brings its wrong answers in a module of its own, and this one test takes them.
MUTANTS = [mutant for path in sorted(Path(__file__).parent.glob("mutants_*.py"))
           for mutant in importlib.import_module(path.stem).MUTANTS]


@pytest.mark.parametrize("name, wrong, phrase", MUTANTS,
                         ids=[f"{n}-{w.__name__}" for n, w, _ in MUTANTS])
def test_a_wrong_answer_is_rejected_with_a_helpful_message(name, wrong, phrase):
    with pytest.raises(ex.ExerciseFailed) as failure:
        ex.check(name, wrong)
    message = str(failure.value)
    assert re.search(phrase, message), f"{phrase!r} not in: {message}"
    assert "seed" in message, f"the rejection does not say how to reproduce it: {message}"


def test_every_exercise_has_three_wrong_answers():
    counts = {name: sum(n == name for n, _, _ in MUTANTS) for name in ex.names()}
    assert all(count >= 3 for count in counts.values()), counts
    assert all(ex.describe(name) for name in ex.names())


def half_done_max(value):
    if dist.get_rank() == 0:
        return value
    raise NotImplementedError("the other ranks")


def half_written_zero1_step(params, owners, local_optimizer):
    if local_optimizer is not None:
        local_optimizer.step()
    raise NotImplementedError("the broadcasts are next")


@pytest.mark.parametrize("name, fn", [("00.max_over_ranks", half_done_max),
                                      ("10.zero1_step", half_written_zero1_step)])
def test_a_not_implemented_error_on_a_rank_means_not_solved_yet(name, fn):
    """A half-written attempt is no stub (test_stubs.py), yet the check says not solved."""
    assert ex.NOT_SOLVED in ex.check(name, fn)


# Right answers that differ from the reference (another collective, another order, a
# ReduceOp the backend supports): RIGHT in a mutants module, each must pass its check.
RIGHT = [right for path in sorted(Path(__file__).parent.glob("mutants_*.py"))
         for right in getattr(importlib.import_module(path.stem), "RIGHT", [])]


@pytest.mark.parametrize("name, answer", RIGHT, ids=[f"{n}-{a.__name__}" for n, a in RIGHT])
def test_a_right_but_different_answer_passes(name, answer):
    assert "passed" in ex.check(name, answer)
