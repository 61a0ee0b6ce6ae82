"""What the launcher learns of a rank's failure: one typed record, written by the rank and read
by every verdict through its fields.

On disk (the rank's error file) and on a live rank's reply pipe it travels as plain data, a
JSON object of strings and a number, never as a pickle: the kernel reads these files, and
unpickling runs whatever the pickle names (verdict/plain_values.py), so a rank whose code a
checker does not trust could otherwise run code in the kernel with its "error". What cannot
be read as a record (a truncated file, a field missing) becomes an *unreadable* record that
says so, rather than a ``KeyError`` deep in the verdict.
"""

from __future__ import annotations

import json
import os
import traceback as traceback_module
from dataclasses import dataclass
from pathlib import Path

from ddp_lab.launch.errors import safe_message, short_message

LAUNCHER_MODULES = ("ddp_lab.launch.rank.main", "ddp_lab.launch.rank.cell",
                    "ddp_lab.launch.rank.pinned_rendezvous",
                    "ddp_lab.launch.live.rank_loop")  # frames a user's traceback skips
UNREADABLE = "UnreadableFailureRecord"  # the type name of a record that could not be read


@dataclass(frozen=True)
class RankFailure:
    """One rank's failure: the exception's type name, its message, the traceback from the
    user's code on, and when it happened (``time.monotonic()``, which every process of the
    machine shares; None when unknown, e.g. an unreadable record)."""

    type_name: str
    message: str
    traceback: str = ""
    time: float | None = None

    @property
    def headline(self) -> str:
        """``"ValueError: bad batch"``, the whole message."""
        return f"{self.type_name}: {self.message}"

    @property
    def one_line(self) -> str:
        """``"ValueError: bad batch"``, the message's first line, cut short."""
        return f"{self.type_name}: {short_message(self.message)}"

    def to_plain(self) -> dict:
        return {"type": self.type_name, "message": self.message, "traceback": self.traceback,
                "time": self.time}

    @classmethod
    def from_plain(cls, data) -> RankFailure:
        """The record ``to_plain`` gave, or an unreadable one saying what was wrong with it.
        The type and message are what every verdict needs; the traceback and the time may
        be missing (``""``, None)."""
        if not isinstance(data, dict):
            return unreadable(f"a {type(data).__name__} instead of a record")
        text = {key: data.get(key, default) for key, default in
                (("type", None), ("message", None), ("traceback", ""))}
        wrong = [key for key, value in text.items() if not isinstance(value, str)]
        when = data.get("time")
        if when is not None and (isinstance(when, bool) or not isinstance(when, (int, float))):
            wrong.append("time")
        if wrong:
            return unreadable(f"{', '.join(wrong)} missing or not of its type")
        return cls(text["type"], text["message"], text["traceback"],
                   None if when is None else float(when))


def unreadable(why: str) -> RankFailure:
    """A record for a failure whose record could not be read: the rank failed (it wrote
    one), and its log holds what it printed."""
    message = (f"this rank's failure record could not be read ({why}); the rank failed, "
               "and its log (err.logs[rank]) holds what it printed")
    return RankFailure(UNREADABLE, message, f"{UNREADABLE}: {message}")


def failure_of(exc: BaseException, when: float) -> RankFailure:
    """The record of ``exc``, raised at ``when``; its traceback starts at the user's code."""
    message = safe_message(exc)
    return RankFailure(type(exc).__name__, message, _format_traceback(exc, message), when)


def write_failure(path: Path, failure: RankFailure) -> None:
    """Write aside, then rename over: a reader never sees half a record."""
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(failure.to_plain()))
    os.replace(tmp, path)


def read_failure(path: Path) -> RankFailure | None:
    """The record a rank left at ``path``; None when it left none."""
    try:
        text = path.read_text(errors="replace")
    except FileNotFoundError:
        return None
    try:
        return RankFailure.from_plain(json.loads(text))
    except ValueError as exc:  # JSONDecodeError: not a record at all
        return unreadable(f"not JSON: {short_message(str(exc))}")


def _format_traceback(exc: BaseException, message: str) -> str:
    try:
        text = "".join(traceback_module.format_exception(exc.with_traceback(_user_frames(exc))))
    except Exception:  # noqa: BLE001 - e.g. a broken __notes__ or a cause's __str__
        text = "".join(traceback_module.format_tb(_user_frames(exc)))
        text = f"Traceback (most recent call last):\n{text}{type(exc).__name__}: {message}\n"
    # what traceback writes when str(exc) raises; say what we know instead
    return text.replace("<exception str() failed>", message)


def _user_frames(exc: BaseException):
    """The traceback without the launcher's own frames: it should start at the user's code."""
    tb = exc.__traceback__
    while tb is not None and tb.tb_next is not None and \
            tb.tb_frame.f_globals.get("__name__") in LAUNCHER_MODULES:
        tb = tb.tb_next
    return tb
