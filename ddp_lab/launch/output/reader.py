"""The one reader of child-process output: pipes read without blocking, up to a deadline,
bytes split into whole lines per owner (a rank, a torchrun agent).

Whole lines because an echo that printed half a line would let another rank's line land
in the middle of it. Lines are what a terminal would show: a progress bar (tqdm redraws the
current line with ``\\r`` instead of ending it) is reported as a status while it is being
redrawn and becomes a line only when it ends. Every byte is looked at a bounded number of
times, so a chatty rank costs time in proportion to what it prints.
"""

from __future__ import annotations

import os
import selectors
import time
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import BinaryIO

CHUNK = 1 << 16
# A redrawn line longer than this is no progress bar: stop re-reading it as a status on
# every chunk (that would cost time quadratic in its length) until it ends as a line.
MAX_STATUS_BYTES = 4096
# A line longer than this is cut into lines of this length, also while it is unfinished: a
# rank that never prints a newline (binary data, a display redrawn without \r) must not
# grow the kernel's memory without bound; no line a person
# reads is this long.
MAX_LINE_BYTES = 1 << 20

Route = Callable[[bytes], list[tuple[Hashable, bytes]]]


def visible_text(raw: bytes) -> str:
    """What a terminal would show for a line with carriage returns: its last non-empty
    ``\\r`` segment (tqdm redraws a bar by writing ``\\r`` and the new bar)."""
    segments = [s for s in raw.split(b"\r") if s.strip()]
    return (segments[-1] if segments else b"").decode("utf-8", "replace")


class LineSplitter:
    """One stream's bytes in, whole lines out; the unfinished line is kept as the pieces it
    arrived in and joined once, when its newline comes."""

    def __init__(self):
        self._pieces: list[bytes] = []
        self._size = 0
        self._redrawn = False  # the unfinished line holds a \r: a bar being redrawn

    @property
    def pending(self) -> bool:
        return bool(self._pieces)

    def feed(self, chunk: bytes) -> tuple[list[str], str | None]:
        """The lines this chunk completed, and the progress text if the unfinished line
        is a bar being redrawn (None otherwise)."""
        *complete, tail = chunk.split(b"\n")
        lines = []
        if complete:
            complete[0] = b"".join([*self._pieces, complete[0]])
            self._pieces, self._size, self._redrawn = [], 0, False
            lines = [visible_text(part) for raw in complete for part in _cut(raw)]
        self._keep(tail)
        return lines + self._cut_unfinished(), self._status()

    def flush(self) -> list[str]:
        """The unfinished line as a line (its stream ended without a newline)."""
        return self.feed(b"\n")[0] if self._pieces else []

    def _keep(self, tail: bytes) -> None:
        if b"\r" in tail:  # older redraws of the bar are gone for good
            tail = tail[tail.rfind(b"\r"):]
            self._pieces, self._size, self._redrawn = [], 0, True
        if tail:
            self._pieces.append(tail)
            self._size += len(tail)

    def _cut_unfinished(self) -> list[str]:
        """The unfinished line's first ``MAX_LINE_BYTES`` as a line, once it is longer:
        where a newline would have cut it (``_cut``)."""
        if self._size <= MAX_LINE_BYTES:
            return []
        *full, rest = _cut(b"".join(self._pieces))
        self._pieces, self._size = [rest], len(rest)
        return [visible_text(part) for part in full]

    def _status(self) -> str | None:
        if not self._redrawn or self._size > MAX_STATUS_BYTES:
            return None
        return visible_text(b"".join(self._pieces))


def _cut(raw: bytes) -> list[bytes]:
    """A line as lines of at most ``MAX_LINE_BYTES``, each cut at a character's start, so
    that where a long line is cut depends on its bytes only, not on how the pipe split it."""
    parts = []
    while len(raw) > MAX_LINE_BYTES:
        at = _char_start(raw, MAX_LINE_BYTES)
        parts.append(raw[:at])
        raw = raw[at:]
    return [*parts, raw]


def _char_start(data: bytes, at: int) -> int:
    """``at``, or the start of the UTF-8 character ``at`` falls in (continuation bytes are
    0b10xxxxxx; a character has at most three)."""
    start = at
    while start > at - 3 and data[start] & 0xC0 == 0x80:
        start -= 1
    return start


@dataclass(frozen=True)
class Output:
    """What one read brought for one owner: the lines it completed, and the current
    progress text (None when no bar is being redrawn)."""

    owner: Hashable
    lines: list[str]
    status: str | None = None


class _Stream:
    """One pipe and a splitter per owner found in it (several when a route demultiplexes
    a stream that carries many owners' output, as torchrun's ``--tee`` does)."""

    def __init__(self, pipe: BinaryIO, route: Route):
        self.pipe = pipe
        self.route = route
        self.splitters: dict[Hashable, LineSplitter] = {}

    def feed(self, chunk: bytes) -> list[Output]:
        outputs = []
        for owner, piece in self.route(chunk):
            splitter = self.splitters.setdefault(owner, LineSplitter())
            outputs.append(Output(owner, *splitter.feed(piece)))
        return outputs

    def flush(self) -> list[Output]:
        return [Output(owner, splitter.flush())
                for owner, splitter in self.splitters.items() if splitter.pending]


class OutputReader:
    """Reads several pipes at once; it owns them and closes each at its end (or ``close``).

        reader.add(pipe, owner)
        while reader.open:
            for out in reader.read(until=deadline): ...   # Output(owner, lines, status)
    """

    def __init__(self):
        self._selector = selectors.DefaultSelector()

    def add(self, pipe: int | BinaryIO, owner: Hashable = None, route: Route | None = None):
        """Read ``pipe`` (a descriptor or a binary file) on behalf of ``owner``; ``route``
        instead splits each chunk into ``(owner, bytes)`` pieces."""
        if isinstance(pipe, int):
            pipe = open(pipe, "rb", buffering=0)
        os.set_blocking(pipe.fileno(), False)
        stream = _Stream(pipe, route or (lambda chunk: [(owner, chunk)]))
        self._selector.register(pipe, selectors.EVENT_READ, stream)

    @property
    def open(self) -> bool:
        """Whether some pipe has not ended yet."""
        return bool(self._selector.get_map())

    def read(self, until: float) -> list[Output]:
        """What arrived before the monotonic clock reads ``until``: returns as soon as
        something did (at ``until`` with nothing). A pipe that ended is closed and its
        unfinished lines are completed."""
        outputs: list[Output] = []
        for key, _ in self._selector.select(max(0.0, until - time.monotonic())):
            outputs += self._read_one(key.data)
        return outputs

    def read_ready(self, until: float) -> list[Output]:
        """Whatever the pipes hold right now, read until none has more (or ``until``): what
        a process wrote before it said it was done is all there."""
        outputs: list[Output] = []
        while time.monotonic() < until:
            ready = self._selector.select(0)
            if not ready:
                break
            for key, _ in ready:
                outputs += self._read_one(key.data)
        return outputs

    def read_to_the_end(self, quiet_s: float, until: float) -> list[Output]:
        """Read every pipe to its end, for writers that have exited. A pipe that one of
        their children still holds open never ends: stop once all have been quiet for
        ``quiet_s`` (or at ``until``)."""
        outputs: list[Output] = []
        quiet_until = time.monotonic() + quiet_s
        while self.open and time.monotonic() < min(quiet_until, until):
            more = self.read(min(quiet_until, until))
            outputs += more
            if more:
                quiet_until = time.monotonic() + quiet_s
        return outputs

    def flush(self) -> list[Output]:
        """Every unfinished line as a line, for a reader that stops before the end."""
        return [out for key in self._selector.get_map().values() for out in key.data.flush()]

    def close(self) -> None:
        """Close every pipe still open (their unfinished lines are dropped); idempotent."""
        keys = self._selector.get_map()
        if keys is None:  # closed already
            return
        for key in list(keys.values()):
            self._end(key.data)
        self._selector.close()

    def _read_one(self, stream: _Stream) -> list[Output]:
        try:
            chunk = os.read(stream.pipe.fileno(), CHUNK)
        except BlockingIOError:
            return []
        if chunk:
            return stream.feed(chunk)
        self._end(stream)
        return stream.flush()

    def _end(self, stream: _Stream) -> None:
        self._selector.unregister(stream.pipe)
        stream.pipe.close()
