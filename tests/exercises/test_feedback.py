"""Exercise feedback that fits on a screen, as pure functions: a comparison in one line (the
first differing element, "you returned your own tensor"), a traceback cut to the learner's
frames, and the full evidence kept for ``ex.last_failure()``. The same on real ranks is
test_feedback_checks.py's part."""

from __future__ import annotations

import re
import traceback

import pytest
import torch

import ddp_lab.exercises as ex
from ddp_lab.exercises import feedback
from ddp_lab.exercises.driver import describe, number_problem, tensor_problem
from ddp_lab.exercises.feedback_traceback import cut, is_course_file, learners_frames
from ddp_lab.exercises.feedback_values import short, tensor_difference


def _index(message: str) -> tuple[int, ...]:
    found = re.search(r"first difference at \[([\d, ]*)\]", message)
    assert found, message
    return tuple(int(i) for i in found[1].split(", "))


# -- a comparison in one line -------------------------------------------------------------
def test_a_wrong_tensor_is_named_by_its_first_differing_element_not_printed():
    want = torch.arange(25, dtype=torch.int64).reshape(5, 5) * 10 ** 9
    got = want.clone()
    got[2, 3] += 1
    got[4, 0] -= 1
    problem = tensor_difference(got, want)
    assert "\n" not in problem and len(problem) < 200, problem
    assert _index(problem) == (2, 3)
    assert f"expected {int(want[2, 3])}, got {int(got[2, 3])}" in problem
    assert "int64 of shape (5, 5)" in problem and "2 of 25 elements differ" in problem
    assert "tensor(" not in problem


def test_returning_your_own_tensor_is_said_so():
    mine, theirs = torch.randn(4, 3), torch.randn(4, 3)
    assert tensor_difference(mine.clone(), theirs, mine=mine).startswith(
        "you returned your own tensor, unchanged (float32 of shape (4, 3), first difference")
    assert "own tensor" not in tensor_difference(mine + 1, theirs, mine=mine)


def test_dtype_shape_and_type_are_named_before_values():
    want = torch.zeros(3, 4, dtype=torch.int64)
    assert tensor_difference(want.float(), want) == (
        "expected int64 of shape (3, 4), got float32 of shape (3, 4)")
    assert tensor_difference(want[:2], want).endswith("got int64 of shape (2, 4)")
    assert tensor_difference([1, 2], want) == (
        "expected a tensor (int64 of shape (3, 4)), got a list of 2: [1, 2]")


def test_float_tolerance_and_float32_digits():
    want = torch.tensor([1.0, 2.0, 3.0])
    assert tensor_difference(want + 1e-7, want, exact=False) is None
    assert tensor_difference(want + 1e-7, want) is not None
    problem = tensor_difference(torch.tensor([1.0, 2.0, 3.0001]), want, exact=False)
    assert _index(problem) == (2,) and "expected 3, got 3.0000999 (1 of 3 elements differs)" in problem
    assert tensor_difference(want.clone(), want) is None


def test_a_zero_dim_tensor_has_its_one_value():
    assert "at (its one value): expected 1.5, got 2.5 (1 of 1 element differs)" in (
        tensor_difference(torch.tensor(2.5), torch.tensor(1.5)))


def test_short_values_stay_on_a_line():
    assert short(torch.tensor([1, 2])) == "tensor([1, 2]) (int64 of shape (2,))"
    assert short(torch.zeros(100, 100)) == "a tensor (float32 of shape (100, 100))"
    listed = short([torch.zeros(50)] * 9)
    assert listed.startswith("a list of 9: [a tensor (float32 of shape (50,))") and \
        listed.endswith(", ...]") and listed.count("a tensor") == 4
    assert len(short("x" * 1000)) < 120 and describe(None) == "None"
    assert "got a tensor of float32 of shape (1,): return tensor.item()" in number_problem(
        torch.tensor([0.5]), 0.5)


# -- the evidence kept for ex.last_failure() ----------------------------------------------
def test_a_failed_check_keeps_the_full_values_its_message_quotes():
    want, got, mine = torch.randn(30, 30), torch.randn(30, 30), torch.randn(30, 30)
    with feedback.collecting() as evidence:
        tensor_problem(torch.zeros(2), torch.ones(2))  # found, but not what failed
        problem = tensor_problem(got, want, mine=mine)
        failure = feedback.failed("02.shift", f"on 2 ranks (seed 5), rank 1: {problem}",
                                  evidence, recipe=True)
    kept = ex.last_failure()
    assert kept.name == "02.shift" and kept.expected is want and kept.got is got
    assert kept.input is mine and kept.traceback == ""
    lines = str(failure).splitlines()
    assert lines[0] == f"on 2 ranks (seed 5), rank 1: {problem}" and len(lines) == 4
    assert lines[2] == "The full values: ex.last_failure() (.expected, .got)."
    assert lines[3] == "Stuck? ex.recipe('02.shift') spells out the steps."
    report = str(kept)
    from IPython.lib.pretty import pretty
    assert pretty(kept) == report  # what ex.last_failure() shows in a notebook: everything
    assert report.startswith(f"02.shift failed: {kept.message}")
    assert f"expected:\n{want!r}" in report and f"got:\n{got!r}" in report


def test_outside_a_check_nothing_is_kept():
    assert tensor_problem(torch.zeros(2), torch.ones(2)) is not None
    with feedback.collecting() as evidence:
        assert evidence.kept == []


def test_in_ipython_the_failure_shows_as_its_message_alone():
    failure = ex.ExerciseFailed("on 1 rank (seed 3): wrong\n\nStuck? ...")
    assert failure._render_traceback_() == [
        "ExerciseFailed: on 1 rank (seed 3): wrong", "", "Stuck? ..."]


# -- a traceback cut to the learner's frames ----------------------------------------------
def _learner_step(tensor):
    return tensor.view(-1, 7)  # torch raises: the learner's line is this one


def _real_traceback() -> str:
    """A traceback through the course (a ddp_lab function calls the learner's), the
    learner's own function, and torch's dispatcher with a dispatch mode on top."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Instrument(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            return func(*args, **(kwargs or {}))

    try:
        with Instrument():
            tensor_difference(_learner_step(torch.zeros(6)), torch.zeros(1))
    except RuntimeError:
        return traceback.format_exc()
    raise AssertionError("the learner's step did not raise")


def test_a_traceback_keeps_the_learners_frames_and_counts_the_rest():
    full = _real_traceback()
    frames = learners_frames(full)
    shown = "\n".join(frames.lines)
    assert "in _learner_step" in shown and "return tensor.view(-1, 7)" in shown
    assert "in _real_traceback" in shown  # this test file is the learner's code here
    assert "torch/" not in shown and "^^^" not in shown and "RuntimeError" not in shown
    assert frames.learners and frames.hidden >= 1
    text = cut(full)
    assert text.startswith(f"Traceback, your code ({frames.hidden} frame")
    assert "ex.last_failure().traceback has them all" in text.splitlines()[0]


def test_without_a_frame_of_the_learner_the_innermost_is_shown():
    full = ('Traceback (most recent call last):\n'
            f'  File "{ex.__file__}", line 60, in check\n    report = exercise.checker(fn)\n'
            f'  File "{torch.__file__}", line 9, in inner\n    return fn(x)\n'
            "TypeError: f() missing 1 required positional argument: 'k'\n")
    text = cut(full)
    assert text.splitlines() == [
        "Traceback, where it was raised (1 frame of the course and torch hidden; "
        "ex.last_failure().traceback has them all):",
        f'  File "{torch.__file__}", line 9, in inner', "    return fn(x)"]


def test_a_chained_traceback_shows_each_learner_frame_once():
    learner = '  File "/home/me/work.py", line 3, in step\n    x = dist.all_reduce(g)\n'
    course = f'  File "{ex.__file__}", line 9, in _call\n    fn(model)\n'
    full = ("Traceback (most recent call last):\n" + course + learner + "TypeError: a\n\n"
            "The above exception was the direct cause of the following exception:\n\n"
            "Traceback (most recent call last):\n" + course + learner + "TypeError: b\n")
    frames = learners_frames(full)
    assert frames.lines == ('  File "/home/me/work.py", line 3, in step',
                            "    x = dist.all_reduce(g)")
    assert frames.hidden == 3


@pytest.mark.parametrize("path, course", [
    ("/tmp/ipykernel_4242/1234567.py", False), ("<string>", False),
    ("/home/me/my_ddp.py", False), ("<frozen runpy>", True),
    ("/opt/env/lib/python3.11/site-packages/typing_extensions.py", True)])
def test_whose_file_is_whose(path, course):
    assert is_course_file(path) is course
    assert is_course_file(torch.__file__) and is_course_file(feedback.__file__)
    assert is_course_file(traceback.__file__)
