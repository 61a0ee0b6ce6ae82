"""A rank's traceback cut to the learner's own frames.

A learner's function runs inside the checker's trial, under the dispatch modes that switch
built-ins off and count bytes, and its collectives go through torch.distributed, c10d's
logger and torch._dynamo's wrappers: a one-line mistake comes back as thirty lines of frames
the learner did not write. What they wrote is every frame outside the course package, torch,
the installed packages and the standard library; those frames are shown, the others
counted, and the whole traceback stays in ``ex.last_failure().traceback``.
"""

from __future__ import annotations

import linecache
import re
import sys
import sysconfig
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

_FRAME = re.compile(r'^\s*File "(?P<file>[^"]*)", line \d+')
_CARETS = re.compile(r"^\s*[\^~]+\s*$")
_INSTALLED = ("/site-packages/", "/dist-packages/")
ALL_FRAMES = "ex.last_failure().traceback"


@dataclass(frozen=True)
class Frames:
    """The frames a learner reads (their lines, source included) and how many were left
    out."""

    lines: tuple[str, ...]
    hidden: int
    learners: bool  # False: no frame was theirs, ``lines`` holds the innermost frame


def learners_frames(traceback: str) -> Frames:
    """The learner's frames of ``traceback`` (a Python traceback, chained ones included, or
    a faulthandler stack as ``launch.verdict.stacks`` formats it). Without any (their
    function was called with the wrong arguments, say), the innermost frame: where it
    was raised."""
    frames = _frames(traceback)
    mine = [frame for frame in frames if not is_course_file(frame[0])]
    shown = _without_repeats(mine) or frames[-1:]
    return Frames(tuple(line for frame in shown for line in frame[1]),
                  hidden=len(frames) - len(shown), learners=bool(mine))


def cut(traceback: str) -> str:
    """The learner's frames under a title that says what was hidden and where to see it
    (the exception itself is left out: the message names it first)."""
    frames = learners_frames(traceback)
    if not frames.lines:  # no frame at all: nothing to cut
        return traceback.rstrip()
    whose = "your code" if frames.learners else "where it was raised"
    note = f" ({hidden_note(frames.hidden)})" if frames.hidden else ""
    return "\n".join([f"Traceback, {whose}{note}:", *frames.lines])


def hidden_note(hidden: int) -> str:
    return (f"{hidden} frame{'s' if hidden != 1 else ''} of the course and torch hidden; "
            f"{ALL_FRAMES} has them all")


def is_course_file(path: str) -> bool:
    """Whether a frame's file is the course's, torch's, an installed package's or the
    standard library's, rather than the learner's (a notebook cell, their own module)."""
    path = path.replace("\\", "/")
    return (path.startswith("<frozen") or any(part in path for part in _INSTALLED)
            or path.startswith(_library_roots()))


@lru_cache(maxsize=1)
def _library_roots() -> tuple[str, ...]:
    import torch

    import ddp_lab
    packages = (Path(ddp_lab.__file__).parent, Path(torch.__file__).parent)
    paths = sysconfig.get_paths()
    standard = (paths[key] for key in ("stdlib", "platstdlib", "purelib", "platlib"))
    return tuple(str(root).replace("\\", "/").rstrip("/") + "/"
                 for root in (*packages, *standard))


def _frames(traceback: str) -> list[tuple[str, list[str]]]:
    """(file, lines) per frame: its "File ..." line and its source, carets left out."""
    frames: list[tuple[str, list[str]]] = []
    inside = False
    for line in (traceback or "").splitlines():
        if match := _FRAME.match(line):
            frames.append((match["file"], [_cell_named(line, match["file"])]))
            inside = True
        elif inside and line.startswith("    ") and not line.lstrip().startswith("File "):
            if not _CARETS.match(line):
                frames[-1][1].append(line)
        else:
            inside = False
    return frames


def _cell_named(line: str, file: str) -> str:
    """A notebook cell's frame as IPython names it ("Cell In[5], line 3, in f") rather than
    by the file name the kernel compiled it under."""
    shell = _ipython()
    label = shell.compile.format_code_name(file) if shell is not None else None
    if not label:
        return line
    return line.replace(f'File "{file}"', " ".join(label), 1)


def cell_line(traceback) -> str | None:
    """The notebook cell line a kernel-side exception came through, as IPython names it:
    "Cell In[3], line 2: ex.check(...)" (the check cell, the outermost cell frame of the
    traceback object), or None outside a kernel."""
    shell = _ipython()
    while shell is not None and traceback is not None:
        file, line = traceback.tb_frame.f_code.co_filename, traceback.tb_lineno
        label = shell.compile.format_code_name(file)
        if label:
            return f"{' '.join(label)}, line {line}: {linecache.getline(file, line).strip()}"
        traceback = traceback.tb_next
    return None


def _ipython():
    """The running IPython shell, if this is a kernel (IPython is never imported here)."""
    module = sys.modules.get("IPython")
    shell = module.get_ipython() if module is not None else None
    return shell if hasattr(getattr(shell, "compile", None), "format_code_name") else None


def _without_repeats(frames: list) -> list:
    """A chained traceback repeats the frames both exceptions passed through: once each."""
    seen, kept = set(), []
    for frame in frames:
        key = tuple(frame[1])
        if key not in seen:
            seen.add(key)
            kept.append(frame)
    return kept
