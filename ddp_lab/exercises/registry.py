"""What an exercise is, and the one place that lists them all.

Each chapter owns its exercises: ``ddp_lab/course/chNN_topic/exercises.py`` holds notebook NN's,
``exercises_b.py`` beside it notebook NNb's; each declares a tuple ``EXERCISES`` of
:class:`Exercise`. The registry imports those modules lazily, so ``ddp_lab.exercises.names()``
costs nothing until a checker is needed.
"""

from __future__ import annotations

import importlib
import importlib.util
import pkgutil
from dataclasses import dataclass
from typing import Callable


class ExerciseFailed(AssertionError):
    """The learner's function gave a wrong answer: the message says which rank, which input,
    expected against got, and what to look at. An AssertionError, so a check cell that fails
    reads like any failed assert."""

    def _render_traceback_(self) -> list[str]:
        """IPython shows the check cell's line and the feedback: the frames of ``ex.check``
        and the checker say nothing the message does not (``ex.last_failure()`` keeps the
        rest). The cell's line comes first, where IPython puts it (and the notebook runner
        reads it)."""
        from ddp_lab.exercises.feedback_traceback import cell_line
        where = cell_line(self.__traceback__)
        lines = f"{type(self).__name__}: {self}".splitlines()
        return [where, *lines] if where else lines


@dataclass(frozen=True)
class Exercise:
    """One exercise.

    ``checker(fn)`` runs the learner's ``fn`` (on real ranks where the exercise is
    distributed) and returns a one-paragraph report, or raises :class:`ExerciseFailed`.
    ``solution`` is the reference solution: a function with the same signature as the stub.
    ``hint`` is shown when the check meets a stub (not solved yet): it points the way without
    being the answer. ``recipe`` spells the steps out; it is offered only after a failed
    attempt (the failure says how to ask for it) or on request (``ex.recipe(name)``).
    ``answered_by`` names the course code whose source answers the exercise
    (``"module:Qualified.name"``): its notebook shows that source only after the check.
    ``points`` and ``visibility`` are what a grade gives it (``ddp-lab grade`` and the
    nbgrader, Otter and Gradescope exports read them here, nowhere else): ``visibility`` is
    Gradescope's word (``"visible"``, ``"after_due_date"``, ``"after_published"``,
    ``"hidden"``). ``open_doors`` names what stays open while the learner's function runs
    (``ddp_lab.exercises.sealed.DOORS``: an exercise about the store keeps ``"store"``);
    everything else is closed there.
    """

    name: str
    notebook: str
    summary: str
    hint: str
    solution: Callable
    checker: Callable[[Callable], str]
    answered_by: tuple[str, ...] = ()
    recipe: str = ""
    points: int = 1
    visibility: str = "visible"
    open_doors: tuple[str, ...] = ()


def all_exercises() -> dict[str, Exercise]:
    """Every exercise by name, in notebook order, from the ``EXERCISES`` of each module."""
    found: dict[str, Exercise] = {}
    for module in exercise_modules():
        for exercise in module.EXERCISES:
            if exercise.name in found:
                raise RuntimeError(f"two exercises are called {exercise.name!r}: "
                                   f"{module.__name__} and an earlier module")
            found[exercise.name] = exercise
    return dict(sorted(found.items(), key=lambda item: (item[1].notebook, item[0])))


EXERCISE_MODULES = ("exercises", "exercises_b")  # a chapter's notebook NN, and its NNb


def exercise_modules() -> list:
    """Every chapter's exercise modules, imported, in chapter order."""
    course = importlib.import_module("ddp_lab.course")
    chapters = sorted(info.name for info in pkgutil.iter_modules(course.__path__)
                      if info.ispkg and info.name.startswith("ch"))
    return [importlib.import_module(f"ddp_lab.course.{chapter}.{module}")
            for chapter in chapters for module in EXERCISE_MODULES
            if importlib.util.find_spec(f"ddp_lab.course.{chapter}.{module}") is not None]


def find(name: str) -> Exercise:
    exercises = all_exercises()
    if not isinstance(name, str) or name not in exercises:
        raise ValueError(f"no exercise called {name!r}; ddp_lab.exercises.names() lists them: "
                         f"{', '.join(exercises) or '(none yet)'}")
    return exercises[name]
