"""A sign of life for long runs: one line at 10 s, 20 s, 40 s... while ranks keep running.

Plain lines (not a redrawn bar) so they read the same in a notebook cell, a terminal and a
CI log, and never split a rank's line: they go through the run's echo, the one writer to
the cell (echo.py).
"""

from __future__ import annotations

import time
from collections.abc import Callable

from ddp_lab.launch.deadlines import FIRST_BEAT_S
from ddp_lab.launch.errors import describe_ranks


class Heartbeat:
    """``running()`` lists the ranks still going; nothing is written when ``enabled`` is
    False (a run without echo)."""

    def __init__(self, echo, timeout: float, started: float, running: Callable[[], list],
                 enabled: bool = True):
        self.echo, self.timeout, self.started = echo, timeout, started
        self.running, self.enabled = running, enabled
        self.offset = FIRST_BEAT_S

    def next_at(self) -> float:
        return self.started + self.offset if self.enabled else float("inf")

    def maybe_beat(self) -> None:
        elapsed = time.monotonic() - self.started
        if not self.enabled or elapsed < self.offset:
            return
        running = self.running()
        if not running:
            return
        self.echo.note(f"[ddp_lab] {elapsed:.0f} s: {describe_ranks(running)} still running "
                       f"(timeout {self.timeout:g} s)\n")
        self.offset *= 2
