"""A sign of life for long runs: one line at 10 s, 20 s, 40 s... while ranks keep running.

Plain lines (not a redrawn bar) so they read the same in a notebook cell, a terminal and a
CI log, and never split a rank's line.
"""

from __future__ import annotations

import sys
import time

from ddp_lab.launch.deadlines import FIRST_BEAT_S
from ddp_lab.launch.errors import describe_ranks



class Heartbeat:
    def __init__(self, timeout: float, enabled: bool = True):
        self.timeout = timeout
        self.enabled = enabled
        self.offset = FIRST_BEAT_S

    def next_at(self, started: float) -> float:
        return started + self.offset if self.enabled else float("inf")

    def maybe_beat(self, started: float, running: list[int]) -> None:
        elapsed = time.monotonic() - started
        if not self.enabled or elapsed < self.offset or not running:
            return
        sys.stdout.write(f"[ddp_lab] {elapsed:.0f} s: {describe_ranks(running)} still running "
                         f"(timeout {self.timeout:g} s)\n")
        sys.stdout.flush()
        self.offset *= 2
