"""Which audited events a closed door refuses (sealed.py's audit hook asks
:func:`refused_event`), and what a learner's function may read: modules anywhere, and the
Python and package files."""

from __future__ import annotations

import os
import sys
import types

from ddp_lab.exercises.fingerprints import PACKAGE, fingerprint, nested

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


def writes(args: tuple) -> bool:
    _, mode, flags = (tuple(args) + (None, None, None))[:3]
    if isinstance(mode, str):
        return any(c in mode for c in "wax+")
    return isinstance(flags, int) and bool(flags & WRITE_FLAGS)


def readable(path) -> bool:
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


def refused_event(event: str, args: tuple, seal, protected: set[int]) -> str | None:
    """Why ``event`` is refused under ``seal`` (its closed doors, its references), or None.
    ``protected``: the ids of the checker's frames above the sealed call."""
    closed = seal.closed
    if event in SEAL_EVENTS:
        door = "subprocess" if event.startswith("ctypes") else "frames"
        return f"{event} is closed while your function is checked: {WHY[door]}"
    if event == "open" and "files" in closed and writes(args):
        return f"writing {args[0]!r} is closed in this exercise: {WHY['files']}"
    if event == "open" and "files" in closed and not readable(args[0]):
        return f"reading {args[0]!r} is closed in this exercise: {WHY['files']}"
    for door, events in (("files", FILE_EVENTS), ("subprocess", PROCESS_EVENTS),
                         ("gc", GC_EVENTS)):
        if door in closed and event in events:
            return f"{event} is closed in this exercise: {WHY[door]}"
    if "sockets" in closed and event.startswith("socket."):
        return f"{event} is closed in this exercise: {WHY['sockets']}"
    if event == "exec" and isinstance(args[0], types.CodeType) and _holds_reference(args[0], seal.references):
        return ("exec of the reference's source is out of reach while your function is "
                "checked: write the function yourself")
    if "frames" in closed and _reaches_checker(event, args, protected):
        return f"the frames above your function are closed: {WHY['frames']}"
    return None


def _holds_reference(code: types.CodeType, references: dict) -> bool:
    """Code compiled from a string (``exec(source)``: no file of that name) that holds a
    whole reference function. An import reads a file: a reference imported from the package
    refuses when called, and a module of the learner's own is the learner's code."""
    if os.path.exists(code.co_filename):
        return False
    return any(fingerprint(inner) in references for inner in nested(code))


def _reaches_checker(event: str, args: tuple, protected: set[int]) -> bool:
    if event == "sys._getframe":
        return id(args[0]) in protected
    if event == "object.__getattr__" and args[1] == "tb_frame":
        frame = getattr(args[0], "tb_frame", None)
        return frame is not None and id(frame) in protected
    return False
