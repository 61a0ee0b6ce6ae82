"""The messages between the kernel and a live rank, and how they travel.

Each rank has two pipes besides its output: calls go down one, replies come up the other,
each message a pickle behind its length. Pipes, not the run folder: a call is a message to
each rank and one back, which a pipe does in microseconds (``ddp-lab bench ranks``).
The kernel never blocks on a pipe: a rank that stopped reading cannot wedge the notebook.
"""

from __future__ import annotations

import os
import pickle
import select
import struct
import time
from dataclasses import dataclass

HEADER = struct.Struct("!Q")
KINDS = ("ready", "run", "exec", "pull", "push")


@dataclass(frozen=True)
class Call:
    """What the kernel asks of a rank. ``body`` is already pickled (``payload.dumps``) for
    ``run`` and ``push``, so that it is pickled once however many ranks it goes to."""

    seq: int
    kind: str
    body: object = None


@dataclass(frozen=True)
class Reply:
    """A rank's answer to call ``seq``: ``ok`` with its value pickled, ``error`` with a
    failure record as plain data (``RankFailure.to_plain()``, rank/failure.py), or ``interrupted`` (SIGINT
    reached the call's Python code: the rank is idle again, its namespace intact)."""

    seq: int
    rank: int
    status: str
    body: object = None


class RankGone(OSError):
    """The pipe to a rank is closed (the rank died) or stayed full until the deadline."""


def encode(message) -> bytes:
    data = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
    return HEADER.pack(len(data)) + data


def send(fd: int, message, until: float) -> None:
    """Write the whole message to a non-blocking pipe, waiting for room until the
    monotonic time ``until``."""
    data = memoryview(encode(message))
    while data:
        try:
            data = data[os.write(fd, data):]
        except BlockingIOError:
            wait = until - time.monotonic()
            if wait <= 0 or not select.select([], [fd], [], wait)[1]:
                raise RankGone("the rank does not read its calls") from None
        except (BrokenPipeError, OSError) as exc:
            raise RankGone(f"the rank's call pipe is closed ({exc})") from None


class FrameReader:
    """Bytes in, whole messages out: an ``output.OutputReader`` route, so one select loop
    reads the ranks' output and their replies alike. It shows no lines; what it parsed is
    taken from ``messages``."""

    def __init__(self):
        self.buffer = bytearray()
        self.messages: list = []

    def __call__(self, chunk: bytes) -> list:
        self.buffer += chunk
        while len(self.buffer) >= HEADER.size:
            (size,) = HEADER.unpack_from(self.buffer)
            if len(self.buffer) < HEADER.size + size:
                break
            self.messages.append(pickle.loads(self.buffer[HEADER.size:HEADER.size + size]))
            del self.buffer[:HEADER.size + size]
        return []

    def take(self) -> list:
        messages, self.messages = self.messages, []
        return messages


def receive(fd: int):
    """The next message from a blocking pipe (the rank's side); None when it closed."""
    header = _read_exactly(fd, HEADER.size)
    if header is None:
        return None
    (size,) = HEADER.unpack(header)
    data = _read_exactly(fd, size)
    return None if data is None else pickle.loads(data)


def _read_exactly(fd: int, size: int) -> bytes | None:
    parts, left = [], size
    while left:
        part = os.read(fd, min(left, 1 << 20))
        if not part:
            return None
        parts.append(part)
        left -= len(part)
    return b"".join(parts)
