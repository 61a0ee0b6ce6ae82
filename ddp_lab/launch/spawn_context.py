"""``ddp_lab.spawn(..., join=False)``: the run goes on while the caller does other work.

``torch.multiprocessing.spawn(join=False)`` returns a ProcessContext and the caller joins
it later, in one call or in a loop (``while not context.join(): ...``; see
torch/multiprocessing/spawn.py, ``ProcessContext.join``). Here the whole run, output
echo, deadline and cleanup included, goes on in a thread of its own, exactly as
``spawn(join=True)`` would run it; ``join`` waits for that thread.

A Ctrl-C reaches only the main thread (https://docs.python.org/3/library/signal.html),
so while the caller waits in ``join`` an interrupt is handed on to the run's thread as the
same KeyboardInterrupt: the run stops every rank and cleans up as an interrupted
``spawn`` does, and ``join`` raises it once that is done. A run nobody joins still ends
by its own ``timeout``; its ranks never outlive this process (their lifeline, worker.py).
"""

from __future__ import annotations

import ctypes
import threading


class SpawnContext:
    """What ``spawn(..., join=False)`` returns: ``join(timeout=None)`` -> True once every
    rank has ended (then ``.result`` holds the RunResult); a failed run raises its
    WorkerError or WorkerTimeout from ``join``, as ``mp.spawn``'s ProcessContext raises
    its ProcessRaisedException."""

    def __init__(self, launch):
        self._result = None
        self._error: BaseException | None = None
        # not Thread.join: on Python 3.11 a Ctrl-C inside it marks a live thread as ended
        # (threading.py, _wait_for_tstate_lock releases the lock the thread holds)
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(launch,),
                                        name="ddp_lab-spawn", daemon=True)
        self._thread.start()

    def _run(self, launch) -> None:
        try:
            self._result = launch()
        except BaseException as exc:  # noqa: BLE001 - handed to whoever joins
            self._error = exc
        finally:
            self._done.set()

    def join(self, timeout: float | None = None, grace_period: float | None = None) -> bool:
        """Wait up to ``timeout`` seconds (None: until the run ends); True once it has.
        ``grace_period`` is accepted for ``mp.spawn`` code and not needed: when a rank
        fails, the launcher gives its peers a grace and then stops them itself."""
        __tracebackhide__ = True
        try:
            if not self._done.wait(timeout):
                return False
        except KeyboardInterrupt:
            self._interrupt_run()
            raise
        if self._error is not None:
            raise self._error
        return True

    def _interrupt_run(self) -> None:
        """Raise KeyboardInterrupt in the run's thread (it waits in short polls, so it sees
        it within a fraction of a second) and wait until its cleanup is done."""
        if not self._done.is_set():
            ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(self._thread.ident),
                                                       ctypes.py_object(KeyboardInterrupt))
        # the thread may take it on its very last lines, before it sets _done
        while not self._done.wait(0.1) and self._thread.is_alive():
            pass

    @property
    def result(self):
        """The RunResult (values, logs, seconds) once ``join`` returned True."""
        if not self._done.is_set():
            raise RuntimeError("the run is still going: call join() first")
        if self._error is not None:
            raise self._error
        return self._result

    @property
    def values(self) -> list:
        return self.result.values
