"""What the kernel keeps of one rank's output for ``res.logs`` and ``err.logs``: its first
lines and its last lines, each part bounded, and a count of what was dropped between them.

Bounded because every line used to be kept: a ``print`` left in a training loop grew the
kernel by a gigabyte in 8 seconds, and on a shared machine that memory is everyone's. Head
and tail because a log is read at both ends: how the rank started (its configuration, its first steps) and how it ended (the
traceback, the last step). The marker line says how much is missing where it is missing.

Each kept line costs its length plus ``LINE_COST``, about what Python spends on a short
``str`` and the slot that holds it, so a flood of empty lines is bounded as tightly as a
flood of long ones.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Iterator

LINE_COST = 64
MB = 1 << 20


class KeptLog:
    """A rank's lines: ``extend`` them as they come, iterate (or ``text()``) to read what
    was kept. The head keeps the first lines that cost up to ``limit`` bytes, the tail the
    latest that do (sizes count characters: bytes for ASCII text)."""

    def __init__(self, limit: int):
        self.limit = limit
        self.clear()

    def clear(self) -> None:
        """Forget every line (a live session's next call starts a log of its own)."""
        self.head: list[str] = []
        self.tail: deque[str] = deque()
        self._head_cost = self._tail_cost = 0
        self.dropped_lines = self.dropped_bytes = 0

    def extend(self, lines: Iterable[str]) -> None:
        for line in lines:
            self.append(line)

    def append(self, line: str) -> None:
        cost = len(line) + LINE_COST
        if not self.tail and self._head_cost + cost <= self.limit:
            self.head.append(line)
            self._head_cost += cost
            return
        self.tail.append(line)
        self._tail_cost += cost
        while self._tail_cost > self.limit and len(self.tail) > 1:  # the last line stays
            self._drop(self.tail.popleft())

    def _drop(self, line: str) -> None:
        self._tail_cost -= len(line) + LINE_COST
        self.dropped_lines += 1
        self.dropped_bytes += len(line) + 1  # its newline too: what the rank printed

    def __iter__(self) -> Iterator[str]:
        yield from self.head
        if self.dropped_lines:
            yield self.marker()
        yield from self.tail

    def text(self) -> str:
        return "\n".join(self)

    def marker(self) -> str:
        """The line that stands where lines were dropped."""
        return (f"... [ddp_lab: {self.dropped_lines} lines ({_mb(self.dropped_bytes)}) "
                f"dropped here; the first {_mb(_printed(self._head_cost, len(self.head)))} "
                f"and the last {_mb(_printed(self._tail_cost, len(self.tail)))} of this "
                "rank's output are kept] ...")


def _printed(cost: int, lines: int) -> int:
    """What ``lines`` kept lines of this ``cost`` were as printed: each with its newline."""
    return cost - (LINE_COST - 1) * lines


def _mb(size: int) -> str:
    return f"{size / MB:.1f} MB"
