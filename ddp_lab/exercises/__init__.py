"""The exercises: a registry of names, checkers that run a learner's function on real ranks,
and the reference solutions, kept apart from the notebooks like a solutions folder.

    import ddp_lab.exercises as ex
    ex.names()                     # every exercise
    ex.check("02.all_gather", fn)  # a report, or ExerciseFailed saying what is wrong
    ex.recipe("02.all_gather")     # the steps spelled out, for when the hint is not enough
    ex.solution("02.all_gather")   # the reference solution
    ex.last_failure()              # the last failed check, whole: full tensors, traceback

A check on a stub (the cell as shipped) prints "not solved yet" and a hint instead of failing,
so a notebook runs top to bottom before the learner has written anything. A failed check
says what is wrong in a few lines (the first differing element, not both tensors; a crash's
traceback cut to the learner's own frames); ``ex.last_failure()`` has everything behind them.
"""

from __future__ import annotations

from ddp_lab.exercises.feedback import Failure, collecting, failed, last_failure
from ddp_lab.exercises.registry import Exercise, ExerciseFailed, all_exercises, find
from ddp_lab.exercises.sealed import Sealed
from ddp_lab.exercises.stubs import is_stub

__all__ = ["names", "check", "solution", "recipe", "describe", "last_failure", "ExerciseFailed",
           "Exercise", "Failure", "NOT_SOLVED"]

NOT_SOLVED = "not solved yet"


def names() -> list[str]:
    """Every exercise's name, in notebook order (``"02.all_gather"``: notebook, then topic)."""
    return list(all_exercises())


def describe(name: str) -> str:
    """What the exercise asks, in one line."""
    return find(name).summary


def solution(name: str):
    """The reference solution: a function with the same signature as the exercise's stub."""
    return find(name).solution


def recipe(name: str) -> str:
    """The steps of one way to solve it, spelled out (the hint only points the way)."""
    exercise = find(name)
    return exercise.recipe or exercise.hint


def check(name: str, fn) -> str:
    """Run ``name``'s checker on ``fn``; return (and print) its report.

    Raises ExerciseFailed when ``fn`` gives a wrong answer: a few lines that name the
    mistake and its smallest evidence, ending by offering the recipe; ``last_failure()``
    then holds the full values and traceback. On a stub, or when ``fn`` raises
    NotImplementedError on some rank, returns a "not solved yet" report with the hint.
    The checker gets ``fn`` sealed (sealed.py): the reference solutions, the store, files,
    threads and the checker's frames are out of its reach while it runs.
    """
    __tracebackhide__ = True  # IPython and pytest show the failure, not this frame
    exercise = find(name)
    if not callable(fn):
        raise TypeError(f"ex.check({name!r}, fn) needs your function, got {type(fn).__name__}")
    if is_stub(fn):
        return _say(f"{name}: {NOT_SOLVED}. {exercise.hint}")
    with collecting() as evidence:
        try:
            report = exercise.checker(Sealed(fn, exercise))
        except NotImplementedError:
            return _say(f"{name}: {NOT_SOLVED}. {exercise.hint}")
        except ExerciseFailed as failure:
            raise failed(name, str(failure), evidence, bool(exercise.recipe)) from None
    return _say(f"{name}: passed. {report}")


def _say(report: str) -> str:
    print(report)
    return report
