"""The one loop every launcher runs while its processes go on: read their output until the
next thing is due, show it, and do what is due.

The fork-server session (and each call to live ranks), the torchrun session and the runner
of torchrun agents differ only in what "due" means (a deadline, a grace after a failure, a
rank's reply) and in what else arrives while they wait (the fork server's answers); those
come in as functions. Deadlines themselves are deadlines.py's.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from ddp_lab.launch.output.reader import Output, OutputReader

# A process's exit does not wake select (a child of it may still hold its pipe open), and
# the fork server's answers arrive on a queue: look at both at least this often.
MAX_WAIT_S = 0.25


class RunLoop:
    """``run(going, step)``: while ``going()``, ``step(now)`` does what is due now and
    returns when the next thing is due; until then ``turn`` reads the output, hands each
    piece to ``take`` and lets the echo write what it batched. ``between(block_s)`` handles
    what else arrived (it may block that long when no pipe is open); ``heartbeat`` says
    which processes still run in long runs."""

    def __init__(self, reader: OutputReader, echo, take: Callable[[Output], None],
                 between: Callable[[float], None] | None = None, heartbeat=None):
        self.reader, self.echo, self.take = reader, echo, take
        self.between = between
        self.heartbeat = heartbeat

    def run(self, going: Callable[[], bool], step: Callable[[float], float]) -> None:
        while going():
            wake = step(time.monotonic())
            if not going():
                return
            self.turn(wake)
            if self.heartbeat is not None:
                self.heartbeat.maybe_beat()

    def turn(self, until: float) -> None:
        """Wait for output (or, with every pipe closed, for ``between``) until ``until`` or
        the echo's or the heartbeat's next moment, whichever comes first."""
        now = time.monotonic()
        until = min(until, self.echo.wake_at(), now + MAX_WAIT_S,
                    self.heartbeat.next_at() if self.heartbeat is not None else until)
        if self.reader.open:
            for out in self.reader.read(until):
                self.take(out)
            if self.between is not None:
                self.between(0.0)
        elif self.between is not None:
            self.between(max(0.0, until - now))
        else:
            time.sleep(max(0.0, until - now))
        self.echo.tick()
