"""Ctrl-C held back while the launcher creates a resource and notes how to release it.

A KeyboardInterrupt is raised between any two bytecodes of the main thread, so without
this a Ctrl-C landing just after ``os.pipe()`` returned and before the descriptors were
registered for cleanup leaks them for the life of the kernel. Inside ``deferred()`` a
SIGINT is only recorded; it is delivered (KeyboardInterrupt, as before) the moment the
block ends, when everything it created is in the cleanup list.
https://docs.python.org/3/library/signal.html#note-on-signal-handlers-and-exceptions
"""

from __future__ import annotations

import signal
import threading


class deferred:  # noqa: N801 - used as a context manager, reads as a phrase
    """``with deferred(): ...``: SIGINT waits until the block is over, then is handled as
    it would have been. Nests; a no-op outside the main thread (Python runs signal
    handlers in the main thread only, so other threads never see a KeyboardInterrupt)."""

    def __enter__(self) -> "deferred":
        self._pending = None
        self._previous = None
        if threading.current_thread() is threading.main_thread():
            previous = signal.getsignal(signal.SIGINT)
            if previous is not None:  # None: a handler installed outside Python, keep it
                self._previous = previous
                signal.signal(signal.SIGINT, self._hold)
        return self

    def _hold(self, signum, frame) -> None:
        self._pending = (signum, frame)

    def __exit__(self, *exc) -> None:
        if self._previous is None:
            return
        signal.signal(signal.SIGINT, self._previous)
        if self._pending is None:
            return
        if callable(self._previous):
            self._previous(*self._pending)  # default_int_handler raises KeyboardInterrupt
        elif self._previous == signal.SIG_DFL:
            signal.raise_signal(signal.SIGINT)
