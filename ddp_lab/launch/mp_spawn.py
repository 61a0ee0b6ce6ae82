"""``spawn``: run a function written for ``torch.multiprocessing.spawn`` unchanged.

Published examples (the PyTorch DDP tutorial,
https://pytorch.org/tutorials/intermediate/ddp_tutorial.html, and pytorch/examples'
distributed/ddp-tutorial-series/multigpu.py) are written as ``fn(rank, world_size)`` that
sets ``MASTER_ADDR``/``MASTER_PORT`` and calls ``init_process_group`` itself. ``ddp_lab.run``
initializes the group before calling fn, so such a function fails there twice over. This
runs it as ``mp.spawn`` would, on the same ranks, output, errors and cleanup as ``run``.

The one thing changed behind the function's back is where its rendezvous goes: each rank
joins this run's own store, bound to 127.0.0.1 on a free port (rank/pinned_rendezvous.py).

``spawn(..., join=False)`` returns a ``SpawnContext``: the run goes on while the caller does
other work. ``torch.multiprocessing.spawn(join=False)`` returns a ProcessContext and the
caller joins it later, in one call or in a loop (``while not context.join(): ...``; see
torch/multiprocessing/spawn.py, ``ProcessContext.join``). Here the whole run, output
echo, deadline and cleanup included, goes on in a thread of its own, exactly as
``spawn(join=True)`` would run it; ``join`` waits for that thread.

A Ctrl-C reaches only the main thread (https://docs.python.org/3/library/signal.html),
so while the caller waits in ``join`` an interrupt is handed on to the run's thread as the
same KeyboardInterrupt: the run stops every rank and cleans up as an interrupted
``spawn`` does, and ``join`` raises it once that is done. A run nobody joins still ends
by its own ``timeout``; its ranks never outlive this process (their lifeline, rank/main.py).
"""

from __future__ import annotations

import ctypes
import functools
import threading

from ddp_lab.launch import checks
from ddp_lab.launch.api import launch, pickle_payload
from ddp_lab.launch.rank.pinned_rendezvous import call_on_rank

START_METHODS = ("spawn", "fork", "forkserver")
SPAWN_CALL_ADVICE = (
    "ddp_lab.spawn calls fn(rank, *args) on every rank, as torch.multiprocessing.spawn "
    "does: fn's first parameter is the rank, args= holds the rest (e.g. args=(world_size,)). "
    "For a function that expects the process group ready, use ddp_lab.run(fn, world_size, "
    "args=...).")


def spawn(fn, args=(), nprocs: int = 1, join: bool = True, daemon: bool = False,
          start_method: str = "spawn", *, timeout: float = 60.0, env=None,
          echo: bool = True):
    """Call ``fn(rank, *args)`` on ``nprocs`` ranks; fn initializes its own process group.

    ``torch.multiprocessing.spawn``'s signature and defaults, positional and keyword (a
    test holds the two side by side), so a script written for ``mp.spawn`` runs with its
    import line changed; ddp_lab's own options are keyword-only. Returns a RunResult
    (``.values``: fn's return value per rank) where ``mp.spawn`` returns None. With
    ``join=False`` it returns at once a SpawnContext whose ``join()`` waits, as
    ``mp.spawn``'s ProcessContext does. ``daemon`` and ``start_method`` are checked and
    otherwise ignored: ranks are always fresh processes forked from ddp_lab's fork server,
    and never outlive the launcher.
    """
    __tracebackhide__ = True
    checks.check_callable(fn)
    _check_mp_options(join, daemon, start_method)
    config = checks.checked_config(nprocs, timeout=timeout, env=env, echo=echo,
                                   init_group=False)
    args, _ = checks.check_call_args(args, None)
    payload = pickle_payload(functools.partial(call_on_rank, fn), args, {})
    checks.check_signature(fn, (0, *args), {}, SPAWN_CALL_ADVICE,
                           call=f"fn(rank, *args), args={args!r}")
    if not join:
        return SpawnContext(functools.partial(launch, config, payload))
    return launch(config, payload)


def _check_mp_options(join, daemon, start_method) -> None:
    """mp.spawn's own options: a wrong type here is a typo or a shifted positional
    argument (ddp_lab.spawn's 4th was timeout once), so it fails before anything starts."""
    for name, value in (("join", join), ("daemon", daemon)):
        if not isinstance(value, bool):
            raise TypeError(f"{name} must be True or False (as in torch.multiprocessing."
                            f"spawn), got {value!r}; ddp_lab's timeout is keyword-only: "
                            "spawn(fn, args, nprocs, timeout=...)")
    if start_method not in START_METHODS:
        raise ValueError(f"unknown start_method {start_method!r}: torch.multiprocessing "
                         f"knows {', '.join(START_METHODS)} (ddp_lab ignores it: ranks are "
                         "always fresh processes from its fork server)")


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
