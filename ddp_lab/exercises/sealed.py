"""The learner's function, sealed: what it may reach while a checker runs it.

A check is only worth something if the learner's function cannot reach the answer around the
exercise. Outside learners found the ways: calling ``ex.solution(...)`` from inside their own
function (or the reference under another name, a copy of its ``__code__``, a re-imported
module, a code object found with ``gc``, an ``exec`` of the module's source); moving the data
through the store, a file, a socket or a thread of their own; reading the checker's frames.
``ex.check`` (and ``ddp-lab grade``) therefore hand the checker :func:`sealed` ``(fn)``
instead of ``fn``: a picklable callable that, in whatever process calls it (a rank, usually),
runs the learner's function with

- the references out of reach: a function whose code equals an exercise's reference solution
  (or one of this exercise's ``answered_by`` targets) by value (its bytecode, names and
  constants; not its file or line numbers) refuses when it is called, however it was reached.
  A reference pasted into a notebook cell is the learner's own code (solved mode does that);
  the reference's own code object, under any name, is not;
- the doors of :data:`DOORS` closed, except those the exercise lists in ``open_doors``;
- the library left as it was: a function, class or module the learner's code rebinds in the
  launcher, the checkers, torch.distributed or the picklers is put back and the call refused
  (``seal_patches``: a patch would run the learner's code after the seal is closed).

A refusal raises :class:`BuiltinSwitchedOff` where it happens, and again when the function
returns if the learner's code caught it. The seal lives in the process that runs the function;
with frames, ``gc``, files, threads and sockets closed it cannot be reached from there. What the
seal does not close (plain attribute access to frames' ``f_back``) the checkers make worthless:
they hand each rank only its own inputs (:func:`deal`) and compare in their own process.
"""

from __future__ import annotations

import contextlib
import functools
import os
import pickle
import sys
import types

from ddp_lab.course.collective_trace import BuiltinSwitchedOff
from ddp_lab.exercises import seal_patches
from ddp_lab.exercises.dealt import Dealt, deal  # noqa: F401 - the seal's public face
from ddp_lab.exercises.fingerprints import PACKAGE, codes_of, fingerprint, \
    own_cell_code, reference_prints
from ddp_lab.exercises.seal_doors import close_store, close_threads
from ddp_lab.exercises.seal_events import DOORS, refused_event
from ddp_lab.launch import payload


class Sealed:
    """The learner's function (or class), pickled, with what its seal needs: called, it
    unpickles the function inside the seal (so nothing of it runs outside) and calls it."""

    def __init__(self, fn, exercise):
        self._set_up(fn.pickled if isinstance(fn, Sealed) else payload.dumps(fn), exercise,
                     getattr(fn, "__name__", type(fn).__name__))
        self.__doc__ = getattr(fn, "__doc__", None)

    @classmethod
    def from_pickled(cls, pickled: bytes, exercise, name: str) -> "Sealed":
        """A function that arrives pickled (``ddp-lab grade`` takes it out of the learner's
        kernel with ``payload.dumps``): it is unpickled only inside the seal, where it runs,
        so whatever its pickle does happens sealed, and never in the grader's process."""
        seal = cls.__new__(cls)
        seal._set_up(bytes(pickled), exercise, name)
        seal.__doc__ = None
        return seal

    def _set_up(self, pickled: bytes, exercise, name: str) -> None:
        self.pickled, self.name, self.__name__, self._fn = pickled, exercise.name, name, None
        self.closed = tuple(door for door in DOORS if door not in exercise.open_doors)
        self.references = reference_prints(exercise)

    def __getstate__(self):
        state = dict(self.__dict__)
        state["_fn"] = None
        return state

    def __call__(self, *args, **kwargs):
        with sealing(self):
            fn = self.function()
            return fn(*args, **kwargs)

    def function(self):
        """The learner's function itself (a class: a subclass whose own methods run sealed),
        unpickled once per process, inside the seal."""
        if self._fn is None:
            with sealing(self):
                fn = pickle.loads(self.pickled)
                _refuse_reference_objects(fn, self)
                self._fn = _sealed_methods(fn, self) if isinstance(fn, type) else fn
        return self._fn


def sealed(fn, exercise) -> Sealed:
    """``fn`` sealed for ``exercise`` (an :class:`~ddp_lab.exercises.registry.Exercise`)."""
    return Sealed(fn, exercise)


# -- the references -----------------------------------------------------------------------
def _refuse_reference_objects(fn, seal: Sealed) -> None:
    """The learner's function must be the learner's code: a reference's own code object
    (``ex.solution(...)`` under another name, a ``__code__`` copy) comes from the package."""
    for code in codes_of(fn):
        what = seal.references.get(fingerprint(code))
        if what and os.path.realpath(code.co_filename).startswith(PACKAGE):
            _refuse(f"{seal.__name__} is {what}, not code of your own: write the function "
                    "yourself")


# -- the seal ---------------------------------------------------------------------------
class _State:
    seal: Sealed | None = None
    depth = 0
    refusals: list[str] = []
    protected: set[int] = set()
    frames: list = []
    own: set[int] = set()
    judged: dict[int, tuple] = {}
    library: list = []
    unsetting = False
    undo: contextlib.ExitStack | None = None

    @staticmethod
    def refuse(message: str):
        _refuse(message)


_STATE = _State()
_HOOKED = False


@contextlib.contextmanager
def sealing(seal: Sealed):
    """Inside the block the learner's code runs sealed (re-entrant: a sealed method that
    calls another stays in the one seal). Raises BuiltinSwitchedOff on leaving if anything
    was refused inside, even if the learner's code caught the refusal."""
    if _STATE.seal is not None:
        _STATE.depth += 1
        try:
            yield
        finally:
            _STATE.depth -= 1
        return
    _open_seal(seal)
    try:
        yield
    finally:
        refusals = _close_seal()
    if refusals:
        raise BuiltinSwitchedOff(refusals[0])


def _open_seal(seal: Sealed) -> None:
    global _HOOKED
    if not _HOOKED:
        sys.addaudithook(_audit)
        _HOOKED = True
    frame, frames = sys._getframe(), []
    while frame is not None:  # kept alive while the seal is open: their ids stay theirs
        frames.append(frame)
        frame = frame.f_back
    _STATE.frames, _STATE.protected = frames, {id(frame) for frame in frames}
    _STATE.refusals, _STATE.judged = [], {}
    _STATE.library = seal_patches.snapshot()  # before the seal's own patches
    _STATE.undo = contextlib.ExitStack()
    if "threads" in seal.closed:
        close_threads(_STATE.undo, _STATE)
    if "store" in seal.closed:
        close_store(_STATE.undo, _STATE)
    _STATE.seal = seal
    _set_profile(_profile)


def _close_seal() -> list[str]:
    _set_profile(None)
    _STATE.seal = None
    _STATE.undo.close()
    rebound = seal_patches.put_back(_STATE.library)
    if rebound:
        _STATE.refusals.append(
            f"your function rebound {', '.join(rebound[:4])}: patching the library is closed "
            "while your function is checked (it was put back); use it as it is")
    _STATE.library = []
    refusals, _STATE.refusals, _STATE.judged = _STATE.refusals, [], {}
    _STATE.frames, _STATE.protected = [], set()
    return refusals


def _set_profile(profile) -> None:
    """The seal's own sys.setprofile, which the audit hook lets through."""
    seal, _STATE.seal = _STATE.seal, None
    try:
        sys.setprofile(profile)
    finally:
        _STATE.seal = seal


def _refuse(message: str):
    _STATE.refusals.append(message)
    raise BuiltinSwitchedOff(message)


def _profile(frame, event, arg):
    """Every Python call inside the seal: a reference's code refuses."""
    if event != "call":
        return
    code = frame.f_code
    verdict = _STATE.judged.get(id(code))
    if verdict is None:
        what = _STATE.seal.references.get(fingerprint(code)) if _STATE.seal else None
        verdict = _STATE.judged[id(code)] = (code, what)  # the code object kept: ids stay unique
    if verdict[1] and not own_cell_code(code):
        # Python unsets a profile function that raises (an audited sys.setprofile): let that
        # through; the refusal is sticky, so the seal still fails the call on leaving.
        _STATE.unsetting = True
        _refuse(f"{verdict[1]} is out of reach while your function is checked: write it "
                "yourself")


def instrument(method):
    """For the checkers' own instruments that run inside the learner's call (a journal of
    the sends, a stdout that takes tickets from the store): their work runs with the seal
    lifted. Only the package's own functions, decorated at import, qualify."""
    if _STATE.seal is not None or not os.path.realpath(
            method.__code__.co_filename).startswith(PACKAGE):
        raise BuiltinSwitchedOff("only the checkers' own instruments may lift the seal")

    @functools.wraps(method)
    def lifted(*args, **kwargs):
        seal, _STATE.seal = _STATE.seal, None
        profile = sys.getprofile()
        _set_profile(None)
        try:
            return method(*args, **kwargs)
        finally:
            _set_profile(profile)
            _STATE.seal = seal
    return lifted


def _audit(event: str, args: tuple) -> None:
    """The audit hook (installed once, for good): while a seal is open, the closed doors'
    events refuse. Everything outside a seal passes untouched."""
    seal = _STATE.seal
    if seal is None:
        return
    if event == "sys.setprofile" and _STATE.unsetting:
        _STATE.unsetting = False
        return
    refused = refused_event(event, args, seal, _STATE.protected)
    if refused:
        _refuse(refused)


def _sealed_methods(cls: type, seal: Sealed) -> type:
    """A subclass of the learner's class whose own methods (those the learner wrote) run
    sealed: a checker that builds the object and calls its methods keeps the seal on."""
    def wrap(method):
        def run(*args, **kwargs):
            with sealing(seal):
                return method(*args, **kwargs)
        run.__name__, run.__qualname__, run.__doc__ = method.__name__, method.__qualname__, \
            method.__doc__
        run.__wrapped__ = method
        return run
    own = {name: wrap(value) for klass in reversed(cls.__mro__) if klass.__module__ == cls.__module__
           for name, value in vars(klass).items()
           if isinstance(value, types.FunctionType) and name != "__init_subclass__"}
    return type(cls.__name__, (cls,), {**own, "__module__": cls.__module__,
                                       "__qualname__": cls.__qualname__})
