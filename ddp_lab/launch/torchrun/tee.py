"""Reading torchrun's output: whose line is it, and what went wrong on a rank.

With ``--tee 3`` torchrun copies every worker line to its own stdout/stderr behind a
prefix built from ``TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE``. We choose a prefix no program
prints (ASCII record/unit separators around the global rank), so the agent's stream splits
back into one stream per rank plus the agent's own lines. A worker's unfinished line (a
progress bar redrawn with ``\\r``) reaches us in pieces, each behind a new prefix, which is
why this splits on prefixes, not on lines.
"""

from __future__ import annotations

import re

from ddp_lab.launch.rank.failure import RankFailure

PREFIX_TEMPLATE = "\x1e${rank}\x1f"
_PREFIX = re.compile(rb"\x1e(\d+)\x1f")
_CUT_PREFIX = re.compile(rb"\x1e\d*")  # what the pipe may have left of a prefix at a chunk's end
_TORCH_RANK_TAG = re.compile(r"^\[rank\d+\]: ?")  # torch's excepthook tags traceback lines
_EXCEPTION_LINE = re.compile(r"^(?P<type>[A-Za-z_][\w.]*)(?::\s?(?P<message>.*))?$")


class TeeDemux:
    """Feed the agent's bytes in; get ``(owner, bytes)`` pieces out, where owner is the
    global rank of a worker or None for the agent itself."""

    def __init__(self):
        self.pending = b""
        self.owner: int | None = None  # who the current, unfinished line belongs to

    def feed(self, data: bytes) -> list[tuple[int | None, bytes]]:
        data, self.pending = self._split_safe(self.pending + data)
        pieces: list[tuple[int | None, bytes]] = []
        parts = _PREFIX.split(data)  # [text, rank, text, rank, text, ...]
        self._route(parts[0], pieces)
        for rank, text in zip(parts[1::2], parts[2::2]):
            self.owner = int(rank)
            self._route(text, pieces)
        return pieces

    def _route(self, text: bytes, pieces: list) -> None:
        """Text up to a newline belongs to the current owner; after it, to the agent
        (a worker's next line comes behind a new prefix)."""
        *lines, rest = text.split(b"\n")
        for line in lines:
            pieces.append((self.owner, line + b"\n"))
            self.owner = None
        if rest:
            pieces.append((self.owner, rest))

    @staticmethod
    def _split_safe(data: bytes) -> tuple[bytes, bytes]:
        """Hold back a prefix cut in two by the pipe (``\\x1e12`` without its ``\\x1f``):
        only those few bytes, so a stray ``\\x1e`` in a worker's output holds back nothing."""
        start = data.rfind(b"\x1e")
        if start != -1 and _CUT_PREFIX.fullmatch(data, start):
            return data[:start], data[start:]
        return data, b""


def last_failure(log: str, when: float | None) -> RankFailure | None:
    """The Python exception at the end of a rank's log, as the default launcher's ranks
    record theirs (type, message, traceback; it happened at ``when``), or None when the log
    holds no traceback."""
    lines = [_TORCH_RANK_TAG.sub("", line) for line in log.splitlines()]
    starts = [i for i, line in enumerate(lines) if line.startswith("Traceback (most recent")]
    frames = [i for i, line in enumerate(lines) if line.startswith('  File "')]
    if not starts or not frames:
        return None
    # the exception line is the first unindented line after the innermost frame
    end = next((i for i in range(frames[-1] + 1, len(lines))
                if lines[i] and not lines[i].startswith(" ")), None)
    match = _EXCEPTION_LINE.match(lines[end]) if end is not None else None
    if match is None:
        return None
    return RankFailure(match["type"].rsplit(".", 1)[-1], match["message"] or "",
                       "\n".join(lines[starts[0]:end + 1]), when)
