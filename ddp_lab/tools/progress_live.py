"""Live progress of ``ddp-lab notebooks`` (and so ``make course``): which notebook runs,
its code cell k of n, and how long it has run.

Why: a notebook runs for a minute or two on a busy machine (09: 145 s), and a silent
terminal looks hung. In a terminal one status line is redrawn in place (``\\r``) every
second; in a CI log, which keeps every byte, lines are printed instead, at most one per
code cell and none within ``quiet`` seconds of the one before: a cell gets its line when
it starts after such a pause, or once it has been busy that long, so that a slow cell
shows in the log and a notebook of 60 quick cells prints a handful of lines.
"""

from __future__ import annotations

import shutil
import sys
import threading
import time
from typing import TextIO

CLEAR_LINE = "\r\x1b[K"


class LiveProgress:
    """The status line of one run of notebooks; also a line printer (``progress(line)``)
    whose lines go above the status line. ``stop()`` ends its ticking thread."""

    def __init__(self, stream: TextIO | None = None, tty: bool | None = None,
                 tick: float = 1.0, quiet: float = 10.0) -> None:
        self.stream = stream or sys.stdout
        self.tty = self.stream.isatty() if tty is None else tty
        self.tick, self.quiet = tick, quiet
        self._lock = threading.Lock()
        self._state: tuple[str, int, int] | None = None  # (notebook label, cell k, of n)
        self._started = self._last_line = 0.0
        self._drawn = False
        self._logged: tuple[str, int] | None = None  # the cell the log has a line for
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._ticking, name="ddp-lab progress",
                                        daemon=True)
        self._thread.start()

    def __call__(self, line: str) -> None:
        """Print a line that stays (a notebook's result), under no status line."""
        with self._lock:
            self._erase()
            self.stream.write(line + "\n")
            self.stream.flush()
            self._last_line = time.monotonic()

    def notebook(self, label: str) -> None:
        """A notebook starts: ``label`` such as "[3/21] 03_collectives.ipynb"."""
        with self._lock:
            self._state = (label, 0, 0)
            self._started = time.monotonic()
            self._show(force=True)

    def cell(self, number: int, total: int) -> None:
        """Code cell ``number`` (from 1) of the ``total`` of the current notebook starts."""
        with self._lock:
            if self._state is not None:
                self._state = (self._state[0], number, total)
                self._show(force=False)

    def done(self) -> None:
        """The current notebook ended: its status line goes."""
        with self._lock:
            self._erase()
            self._state = None

    def stop(self) -> None:
        self.done()
        self._stop.set()
        self._thread.join()

    def __enter__(self) -> LiveProgress:
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def status(self) -> str:
        """The status line as it reads now, e.g. "[3/21] 03_collectives.ipynb: cell 12
        of 58, 41 s"."""
        label, number, total = self._state
        where = f"cell {number} of {total}" if number else "starting its kernel"
        return f"{label}: {where}, {time.monotonic() - self._started:.0f} s"

    def _ticking(self) -> None:
        while not self._stop.wait(self.tick):
            with self._lock:
                if self._state is not None:
                    self._show(force=False)

    def _show(self, force: bool) -> None:
        if self.tty:  # one row, or the next \r would redraw only its wrapped tail
            width = shutil.get_terminal_size().columns - 1
            self.stream.write(CLEAR_LINE + self.status()[:max(width, 20)])
            self._drawn = True
        elif force or self._due_in_log():
            self.stream.write(self.status() + "\n")
            self._last_line = time.monotonic()
            self._logged = self._state[:2]
        self.stream.flush()

    def _due_in_log(self) -> bool:
        quiet_long_enough = time.monotonic() - self._last_line >= self.quiet
        return quiet_long_enough and self._logged != self._state[:2]

    def _erase(self) -> None:
        if self._drawn:
            self.stream.write(CLEAR_LINE)
            self._drawn = False
