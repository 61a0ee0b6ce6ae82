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
- the doors of :data:`DOORS` closed, except those the exercise lists in ``open_doors``.

A refusal raises :class:`BuiltinSwitchedOff` where it happens, and again when the function
returns if the learner's code caught it. The seal lives in the process that runs the function;
with frames, ``gc``, files, threads and sockets closed it cannot be reached from there. What the
seal does not close (plain attribute access to frames' ``f_back``) the checkers make worthless:
they hand each rank only its own inputs (:func:`deal`) and compare in their own process.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import importlib
import inspect
import os
import pickle
import sys
import types
from pathlib import Path

from ddp_lab.course.collective_trace import BuiltinSwitchedOff
from ddp_lab.launch import payload

# What a learner's function finds closed unless its exercise opens it (Exercise.open_doors).
DOORS = ("threads", "store", "files", "sockets", "frames", "gc", "subprocess")

WHY = {
    "threads": "a thread of your own runs outside what the check watches: call the collectives "
               "from your function",
    "store": "the store is the ranks' rendezvous, not a way to move the exercise's data: use "
             "the collectives",
    "files": "data moved through files goes around the exercise: use the collectives",
    "sockets": "a socket of your own goes around the exercise: use the collectives",
    "frames": "the checker's frames are not yours to read: everything your function needs is "
              "in its arguments",
    "gc": "the garbage collector's lists are not a way into the checker: use your arguments",
    "subprocess": "other processes run outside what the check watches",
}


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


class Dealt:
    """Every rank's inputs, made by the checker: each rank takes its own, and the others'
    are wiped from its memory before the learner's function runs."""

    def __init__(self, per_rank: list):
        self.items = [bytearray(payload.dumps(value)) for value in per_rank]

    def take(self, rank: int | None = None):
        """This rank's item (``rank`` defaults to ``dist.get_rank()``); every item's bytes
        are zeroed in place, so a second take, or a look at this object, finds nothing."""
        if self.items is None:
            raise RuntimeError("these inputs were taken already")
        if rank is None:
            import torch.distributed as dist
            rank = dist.get_rank()
        mine = pickle.loads(bytes(self.items[rank]))
        for item in self.items:
            item[:] = bytes(len(item))
        self.items = None
        return mine


def deal(per_rank: list) -> Dealt:
    """``per_rank[r]`` for rank r only: pass the result in a trial's arguments, and call
    ``.take()`` on it in the rank before the learner's function runs."""
    return Dealt(per_rank)


# -- the references -----------------------------------------------------------------------
def reference_prints(exercise) -> dict[str, str]:
    """{fingerprint: what it is} of every exercise's reference solution and of this
    exercise's ``answered_by`` targets (each code object inside them too)."""
    from ddp_lab.exercises.registry import all_exercises
    prints: dict[str, str] = {}
    for other in all_exercises().values():
        _add_prints(other.solution, f"the reference solution of {other.name}", prints)
    for target in exercise.answered_by:
        _add_prints(_resolve(target), f"the course's {target.split(':')[-1]}", prints)
    return prints


def _resolve(target: str):
    module, _, qualified = target.partition(":")
    found = importlib.import_module(module)
    for part in qualified.split("."):
        found = getattr(found, part)
    return found


def _add_prints(obj, what: str, prints: dict) -> None:
    for code in _codes_of(obj):
        prints.setdefault(fingerprint(code), what)


def _codes_of(obj) -> list:
    """The code objects of a function, or of every function a class defines: whole
    functions only (a fingerprint covers the code nested in it). A comprehension or a lambda
    alone is too small to call anybody's: ``[torch.empty_like(t) for _ in range(n)]`` in a
    reference is also in many right answers."""
    if isinstance(obj, type):
        return [code for value in vars(obj).values() if not isinstance(value, type)
                for code in _codes_of(_unwrapped(value))]
    code = getattr(obj, "__code__", None)
    return [code] if isinstance(code, types.CodeType) else []


def _unwrapped(value):
    """The function inside a staticmethod, classmethod or property."""
    for attribute in ("__func__", "fget"):
        inner = getattr(value, attribute, None)
        if isinstance(inner, types.FunctionType):
            return inner
    return value if isinstance(value, types.FunctionType) else None


def _nested(code: types.CodeType):
    yield code
    for constant in code.co_consts:
        if isinstance(constant, types.CodeType):
            yield from _nested(constant)


def fingerprint(code: types.CodeType) -> str:
    """A code object by value: its bytecode, names and constants (nested code by its own
    fingerprint), not where it was compiled: a copy under another file or line has it too.
    A leading string constant (the docstring) is left out."""
    consts = code.co_consts[1:] if code.co_consts[:1] and isinstance(code.co_consts[0], str) \
        else code.co_consts
    parts = (code.co_code, code.co_names, code.co_varnames, code.co_freevars, code.co_argcount,
             code.co_kwonlyargcount,
             tuple(fingerprint(c) if isinstance(c, types.CodeType) else repr(c) for c in consts))
    return hashlib.sha256(repr(parts).encode()).hexdigest()[:32]


PACKAGE = str(Path(__file__).resolve().parents[1])


def _refuse_reference_objects(fn, seal: Sealed) -> None:
    """The learner's function must be the learner's code: a reference's own code object
    (``ex.solution(...)`` under another name, a ``__code__`` copy) comes from the package."""
    for code in _codes_of(fn):
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
    unsetting = False
    undo: contextlib.ExitStack | None = None


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
    _STATE.undo = contextlib.ExitStack()
    if "threads" in seal.closed:
        _close_threads(_STATE.undo)
    if "store" in seal.closed:
        _close_store(_STATE.undo)
    _STATE.seal = seal
    _set_profile(_profile)


def _close_seal() -> list[str]:
    _set_profile(None)
    _STATE.seal = None
    _STATE.undo.close()
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
    if verdict[1] and not _own_cell_code(code):
        # Python unsets a profile function that raises (an audited sys.setprofile): let that
        # through; the refusal is sticky, so the seal still fails the call on leaving.
        _STATE.unsetting = True
        _refuse(f"{verdict[1]} is out of reach while your function is checked: write it "
                "yourself")


def _own_cell_code(code: types.CodeType) -> bool:
    """A reference pasted into a notebook cell is the learner's own code (solved mode does
    that): compiled from a cell (IPython's ``ipykernel_PID/...py`` or ``<...>`` names), not
    from the package's file and not by ``exec`` of a string (``<string>``)."""
    name = code.co_filename
    if name.startswith("<"):
        return name not in NOT_CELLS and not name.startswith("<frozen")
    return "/ipykernel_" in name and not os.path.realpath(name).startswith(PACKAGE)


NOT_CELLS = ("<string>", "<stdin>", "<unknown>")


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


# -- the doors ------------------------------------------------------------------------------
def _close_threads(stack: contextlib.ExitStack) -> None:
    import _thread
    import threading
    refuse = _refuser("threads", "starting a thread")
    for module, name in ((_thread, "start_new_thread"), (_thread, "start_joinable_thread"),
                         (threading, "_start_new_thread"),
                         (threading, "_start_joinable_thread")):
        if hasattr(module, name):
            stack.enter_context(_patched(module, name, refuse))


STORE_METHODS = ("set", "compare_set", "get", "add", "check", "delete_key", "num_keys", "wait",
                 "append", "multi_get", "multi_set", "queue_push", "queue_pop", "queue_len",
                 "list_keys", "barrier", "clone")


def _close_store(stack: contextlib.ExitStack) -> None:
    from torch._C import _distributed_c10d as c10d
    for name in STORE_METHODS:
        if hasattr(c10d.Store, name):
            stack.enter_context(_patched(c10d.Store, name, _store_refuser(
                getattr(c10d.Store, name), f"Store.{name}")))
    for kind in ("TCPStore", "FileStore", "HashStore", "PrefixStore"):
        if hasattr(c10d, kind):
            cls = getattr(c10d, kind)
            stack.enter_context(_patched(cls, "__init__", _store_refuser(
                cls.__init__, f"a new {kind}")))


def _store_refuser(original, what: str):
    """The store door: closed to the learner's code, open to torch making a process group
    (``dist.new_group`` agrees on the group through the store) and to the checkers' own
    instruments (the seal lifted)."""
    def refuse_or_pass(*args, **kwargs):
        if _STATE.seal is None or _making_a_group():
            return original(*args, **kwargs)
        _refuse(f"{what} is closed in this exercise: {WHY['store']}")
    return refuse_or_pass


GROUP_MAKERS = ("new_group", "new_subgroups", "new_subgroups_by_enumeration", "split_group",
                "_new_group_with_tag", "init_device_mesh")


def _making_a_group() -> bool:
    """Whether torch's own code that makes a process group is on this stack."""
    import torch.distributed.distributed_c10d as c10d
    makers = {inspect.unwrap(getattr(c10d, name)).__code__ for name in GROUP_MAKERS
              if hasattr(c10d, name)}  # unwrapped: torch's loggers wrap each in one code
    frame = sys._getframe(2)
    while frame is not None and id(frame) not in _STATE.protected:
        if frame.f_code in makers:
            return True
        frame = frame.f_back
    return False


def _refuser(door: str, what: str):
    def refuse(*args, **kwargs):
        _refuse(f"{what} is closed in this exercise: {WHY[door]}")
    return refuse


@contextlib.contextmanager
def _patched(target, name: str, value):
    original = target.__dict__[name] if name in getattr(target, "__dict__", {}) else \
        getattr(target, name)
    setattr(target, name, value)
    try:
        yield
    finally:
        setattr(target, name, original)


WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_TRUNC
FILE_EVENTS = {"os.mkfifo", "os.mknod", "os.link", "os.symlink", "os.rename", "os.remove",
               "os.rmdir", "os.mkdir", "os.truncate", "os.chmod", "os.chown", "os.utime",
               "shutil.copyfile", "shutil.copytree", "shutil.move", "shutil.rmtree",
               "mmap.__new__", "tempfile.mkstemp", "tempfile.mkdtemp"}
PROCESS_EVENTS = {"os.fork", "os.forkpty", "os.posix_spawn", "os.exec", "os.spawn", "os.system",
                  "subprocess.Popen", "pty.spawn", "os.kill", "os.killpg", "signal.pthread_kill",
                  "os.startfile"}
GC_EVENTS = {"gc.get_objects", "gc.get_referrers", "gc.get_referents"}
SEAL_EVENTS = {"sys.setprofile", "sys.settrace", "sys.addaudithook", "sys._current_frames",
               "ctypes.string_at", "ctypes.wstring_at", "ctypes.dlsym", "ctypes.dlopen"}


def _audit(event: str, args: tuple) -> None:
    """The audit hook (installed once, for good): while a seal is open, the closed doors'
    events refuse. Everything outside a seal passes untouched."""
    seal = _STATE.seal
    if seal is None:
        return
    if event == "sys.setprofile" and _STATE.unsetting:
        _STATE.unsetting = False
        return
    refused = _refused_event(event, args, seal.closed)
    if refused:
        _refuse(refused)


def _refused_event(event: str, args: tuple, closed: tuple) -> str | None:
    if event in SEAL_EVENTS:
        door = "subprocess" if event.startswith("ctypes") else "frames"
        return f"{event} is closed while your function is checked: {WHY[door]}"
    if event == "open" and "files" in closed and _writes(args):
        return f"writing {args[0]!r} is closed in this exercise: {WHY['files']}"
    if event == "open" and "files" in closed and not _readable(args[0]):
        return f"reading {args[0]!r} is closed in this exercise: {WHY['files']}"
    for door, events in (("files", FILE_EVENTS), ("subprocess", PROCESS_EVENTS),
                         ("gc", GC_EVENTS)):
        if door in closed and event in events:
            return f"{event} is closed in this exercise: {WHY[door]}"
    if "sockets" in closed and event.startswith("socket."):
        return f"{event} is closed in this exercise: {WHY['sockets']}"
    if event == "exec" and isinstance(args[0], types.CodeType) and _holds_reference(args[0]):
        return ("exec of the reference's source is out of reach while your function is "
                "checked: write the function yourself")
    if "frames" in closed and _reaches_checker(event, args):
        return f"the frames above your function are closed: {WHY['frames']}"
    return None


def _holds_reference(code: types.CodeType) -> bool:
    """Code compiled from a string (``exec(source)``: no file of that name) that holds a
    whole reference function. An import reads a file: a reference imported from the package
    refuses when called, and a module of the learner's own is the learner's code."""
    if os.path.exists(code.co_filename):
        return False
    return any(fingerprint(inner) in _STATE.seal.references for inner in _nested(code))


def _writes(args: tuple) -> bool:
    _, mode, flags = (tuple(args) + (None, None, None))[:3]
    if isinstance(mode, str):
        return any(c in mode for c in "wax+")
    return isinstance(flags, int) and bool(flags & WRITE_FLAGS)


def _readable(path) -> bool:
    """Reading is open for Python's and the packages' own files and for modules anywhere
    (imports, source lines), and closed elsewhere: the run's folder holds the payload every
    rank was sent."""
    if isinstance(path, int):
        return True
    try:
        where = os.path.realpath(os.fsdecode(path))
    except (TypeError, ValueError):
        return False
    return (where.startswith(_READABLE) or where.endswith(SOURCE_SUFFIXES)
            or where in ("/dev/null", "/dev/urandom"))


SOURCE_SUFFIXES = (".py", ".pyc", ".so")  # what an import reads, wherever the module lives


_READABLE = tuple({os.path.realpath(p) + os.sep for p in (sys.prefix, sys.base_prefix,
                                                          sys.exec_prefix, PACKAGE)})


def _reaches_checker(event: str, args: tuple) -> bool:
    if event == "sys._getframe":
        return id(args[0]) in _STATE.protected
    if event == "object.__getattr__" and args[1] == "tb_frame":
        frame = getattr(args[0], "tb_frame", None)
        return frame is not None and id(frame) in _STATE.protected
    return False


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
