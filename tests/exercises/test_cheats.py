"""The cheats a grade must stop, tried on every exercise: the reference solution reached from
inside the learner's function (by ``ex.solution``, under another name, as a copy of its code,
from a re-imported module, an ``exec`` of its module's source, ``gc``), and the solution run in
a thread of the learner's own. Outside learners got these past the checkers; each must now
be refused with a message that says what is closed (sealed.py)."""

from __future__ import annotations

import gc
import importlib.util
import inspect
import re
import sys
import threading
import types

import pytest

import ddp_lab.exercises as ex

pytestmark = [pytest.mark.timeout(240), pytest.mark.usefixtures("warm_fork_server")]

OUT_OF_REACH = r"out of reach|not code of your own|closed|switched off"


def calls_solution(name):
    def answer(*args, **kwargs):
        return ex.solution(name)(*args, **kwargs)
    return answer


def renamed(name):
    return ex.solution(name)


def code_copy(name):
    solution = ex.solution(name)
    return types.FunctionType(solution.__code__, solution.__globals__, "my_answer",
                              solution.__defaults__, solution.__closure__)


def reimported(name):
    def answer(*args, **kwargs):
        module = sys.modules[ex.solution(name).__module__]
        spec = importlib.util.spec_from_file_location("fresh_copy", module.__file__)
        fresh = sys.modules["fresh_copy"] = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(fresh)
        return getattr(fresh, ex.solution(name).__name__)(*args, **kwargs)
    return answer


def exec_source(name):
    def answer(*args, **kwargs):
        module = sys.modules[ex.solution(name).__module__]
        namespace = {"__name__": "copied"}
        exec(compile(inspect.getsource(module), "<copied>", "exec"), namespace)
        return namespace[ex.solution(name).__name__](*args, **kwargs)
    return answer


def found_by_gc(name):
    def answer(*args, **kwargs):
        wanted = ex.solution(name).__qualname__
        found = next(o for o in gc.get_objects()
                     if isinstance(o, types.FunctionType) and o.__qualname__ == wanted)
        return found(*args, **kwargs)
    return answer


def in_a_thread(name):
    def answer(*args, **kwargs):
        out = []
        worker = threading.Thread(target=lambda: out.append(
            ex.solution(name)(*args, **kwargs)))
        worker.start()
        worker.join()
        return out[0]
    return answer


FUNCTION_CHEATS = (calls_solution, renamed, code_copy, reimported, exec_source, found_by_gc,
                   in_a_thread)
CLASS_CHEATS = (renamed,)


def _cases():
    cases = []
    for name in ex.names():
        is_class = isinstance(ex.solution(name), type)
        for cheat in CLASS_CHEATS if is_class else FUNCTION_CHEATS:
            cases.append(pytest.param(name, cheat, id=f"{name}-{cheat.__name__}"))
    return cases


@pytest.mark.parametrize("name, cheat", _cases())
def test_a_cheat_is_refused(name, cheat):
    with pytest.raises(ex.ExerciseFailed) as failure:
        ex.check(name, cheat(name))
    assert re.search(OUT_OF_REACH, str(failure.value)), str(failure.value)


def test_a_subclass_of_the_reference_class_is_refused():
    """The capstone's class: a subclass whose methods are the reference's."""
    classes = [name for name in ex.names() if isinstance(ex.solution(name), type)]
    for name in classes:
        subclass = type("MyDDP", (ex.solution(name),), {})
        with pytest.raises(ex.ExerciseFailed, match=OUT_OF_REACH):
            ex.check(name, subclass)


def lying_float(value):
    """A right-looking number that equals everything: compared in the checker's process it
    would pass; its class is the learner's, so it never gets there."""
    class Liar(float):
        def __eq__(self, other):
            return True

        def __sub__(self, other):
            return 0.0

        __rsub__ = __sub__
        __hash__ = float.__hash__
    return Liar(value)


def patches_the_pickler(value):
    """Right in the seal, then a patch that would run after it, when the value is sent."""
    import pickle

    import torch
    import torch.distributed as dist
    pickle.dumps = lambda *args, **kwargs: b""
    t = torch.tensor([float(value)], dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return t.item()


@pytest.mark.parametrize("answer, said", [
    (lying_float, "is not plain data"), (patches_the_pickler, "rebound pickle.dumps")])
def test_nothing_of_the_learners_runs_after_the_seal(answer, said):
    with pytest.raises(ex.ExerciseFailed, match=said):
        ex.check("00.max_over_ranks", answer)
