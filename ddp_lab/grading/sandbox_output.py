"""What the grader keeps of a sandboxed command's stdout or stderr: its first and last
bytes, each part bounded, and a line where bytes were dropped (stdlib only).

Bytes, not lines (launch/output/kept_log.py keeps a rank's lines for a person to read):
the grader reads results out of stdout, so what is kept is exactly what was written, and
a flood without a newline is bounded as tightly as one with many.
"""

from __future__ import annotations

MB = 1 << 20


class KeptBytes:
    """``add`` chunks as they come; ``text()`` is the first ``limit / 2`` bytes, then,
    if more came, a line that says how many were dropped, then the last ``limit / 2``."""

    def __init__(self, limit: int):
        self.half = limit // 2
        self.head = bytearray()
        self.tail = bytearray()
        self.dropped = 0

    def add(self, chunk: bytes) -> None:
        room = self.half - len(self.head)
        if room > 0:
            self.head += chunk[:room]
            chunk = chunk[room:]
        self.tail += chunk
        extra = len(self.tail) - self.half
        if extra > 0:
            del self.tail[:extra]
            self.dropped += extra

    def text(self) -> str:
        if not self.dropped:
            return (self.head + self.tail).decode(errors="replace")
        marker = (f"\n... [sandbox: {self.dropped} bytes ({self.dropped / MB:.1f} MB) dropped "
                  f"here; the first and the last {self.half / MB:.1f} MB are kept] ...\n")
        return self.head.decode(errors="replace") + marker + self.tail.decode(errors="replace")
