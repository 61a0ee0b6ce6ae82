"""Notebook 11b's exercise against plausible wrong answers (mutants_ch11b.py): each must be
rejected with a message that points at the mistake and names the seed that reproduces it.
The same test as test_mutations.py's, until its table takes mutants_ch11b.MUTANTS too."""

from __future__ import annotations

import re

import pytest

import ddp_lab.exercises as ex
import mutants_ch11b

pytestmark = [pytest.mark.timeout(240), pytest.mark.usefixtures("warm_fork_server")]

MUTANTS = mutants_ch11b.MUTANTS


@pytest.mark.parametrize("name, wrong, phrase", MUTANTS,
                         ids=[f"{n}-{w.__name__}" for n, w, _ in MUTANTS])
def test_a_wrong_answer_is_rejected_with_a_helpful_message(name, wrong, phrase):
    with pytest.raises(ex.ExerciseFailed) as failure:
        ex.check(name, wrong)
    message = str(failure.value)
    assert re.search(phrase, message), f"{phrase!r} not in: {message}"
    assert "seed" in message, f"the rejection does not say how to reproduce it: {message}"


def test_the_reference_passes():
    name = "11b.interleaved_bubble"
    assert ex.check(name, ex.solution(name)).startswith(f"{name}: passed.")
