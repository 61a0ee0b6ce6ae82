"""The checker loop, written once (driver.each_world): the trial runs on each world size in
turn, and the first problem a judge returns becomes an ExerciseFailed that names the trial
(world size, seed, rank), on real ranks."""

from __future__ import annotations

import pytest

from ddp_lab.exercises import ExerciseFailed
from ddp_lab.exercises.driver import each_world

pytestmark = [pytest.mark.timeout(120), pytest.mark.usefixtures("warm_fork_server")]


def _rank_times(factor: int) -> int:
    import torch.distributed as dist
    return dist.get_rank() * factor


def test_every_world_runs_and_its_values_come_back():
    seen = each_world(_rank_times, lambda n: (n,), seed=7, sizes=(1, 3))
    assert seen == {1: [0], 3: [0, 3, 6]}


def test_the_first_problem_names_the_trial_and_the_rank():
    def judge(value, rank, n):
        return f"got {value}" if value else None

    with pytest.raises(ExerciseFailed, match=r"^on 2 ranks \(seed 7\), rank 1: got 10$"):
        each_world(_rank_times, (10,), judge, 7, sizes=(1, 2, 3))


def test_a_problem_that_goes_on_the_sentence_keeps_its_punctuation():
    def judge_world(values, n):
        return f", the ranks returned {values}" if n == 2 else None

    with pytest.raises(ExerciseFailed, match=r"^there, the ranks returned \[0, 1\]$"):
        each_world(_rank_times, (1,), seed=7, sizes=(1, 2), place=lambda n: "there",
                   judge_world=judge_world)


def test_a_rank_that_cpp_aborted_says_what_was_thrown_and_where_in_your_code():
    """A gloo abort leaves no Python exception: what std::terminate printed (in the rank's
    log) is the sentence, faulthandler's stack is cut to the learner's frames."""
    from ddp_lab import WorkerError
    from ddp_lab.exercises.driver import _failure
    from ddp_lab.exercises.feedback_traceback import _library_roots
    course = _library_roots()[0] + "course/ch02_point_to_point/exercises.py"
    stack = ("Fatal Python error: Aborted\n\nStack (oldest call first):\n"
             f'  File "{course}", line 43, in _run_p2p\n    got = fn(*args)\n'
             '  File "/home/me/ring.py", line 9, in my_all_gather\n    request.wait()\n')
    log = ("rank 1 starts\nterminate called after throwing an instance of "
           "'gloo::EnforceNotMet'\n  what():  [enforce fail at pair.cc:456] 24 vs 12. "
           "Received data size doesn't match expected size.\nFatal Python error: Aborted\n")
    err = WorkerError(rank=1, exitcode=-6, traceback=stack, logs=["", log])
    lines = str(_failure(err, "on 2 ranks (seed 7)", "")).splitlines()
    assert lines[0] == ("on 2 ranks (seed 7): rank 1's process was aborted by C++ code under "
                        "torch (gloo::EnforceNotMet), which said: [enforce fail at pair.cc:456]"
                        " 24 vs 12. Received data size doesn't match expected size.")
    assert lines[2:] == [
        "Traceback, your code (1 frame of the course and torch hidden; "
        "ex.last_failure().traceback has them all):",
        '  File "/home/me/ring.py", line 9, in my_all_gather', "    request.wait()"]
