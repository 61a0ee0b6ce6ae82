"""Which collectives' results the learner's code waited for: the capstone's check of
"sync_gradients() waits on its work handles".

On gloo a ``sync_gradients()`` that never waits often reads the right sums anyway: a later
blocking collective (the map of the parameters used) finishes after the earlier all-reduces,
so their sums happen to be there. That is luck, not the contract ("wait() ... blocks until
the operation is completed", torch/csrc/distributed/c10d/Work.hpp), and it breaks on another
backend or schedule. So the capstone counts the waits themselves: every way to wait on a
collective's result ends in one of the methods patched here (``Work.wait``, which
``dist.all_reduce(async_op=False)`` calls too; a ``Work``'s Future waited, read or polled done,
directly or through ``then`` and ``torch.futures.collect_all``/``wait_all``; ``is_completed()``
seen true; a functional collective's ``wait_tensor``, counted by the trace).
"""

from __future__ import annotations

import contextlib
from typing import Iterator

import torch
from torch._C import _distributed_c10d as c10d

from ddp_lab.exercises.builtins_off import replaced


class WaitLedger:
    """``with WaitLedger() as ledger:`` ...; then ``ledger.waited``: how many distinct Work
    objects the code inside waited on (or saw complete)."""

    def __init__(self):
        self._works: set[int] = set()
        self._owner: dict[int, tuple[int, ...]] = {}  # id(future) -> the works it stands for
        self._kept: list = []  # the objects behind the ids, so that no id is reused

    @property
    def waited(self) -> int:
        return len(self._works)

    def _mark_work(self, work) -> None:
        self._kept.append(work)
        self._works.add(id(work))

    def _mark_future(self, future) -> None:
        for work in self._owner.get(id(future), ()):
            self._works.add(work)

    def _own(self, future, works: tuple[int, ...]) -> None:
        self._kept.append(future)
        self._owner[id(future)] = self._owner.get(id(future), ()) + works

    @contextlib.contextmanager
    def _patched(self) -> Iterator[None]:
        ledger = self
        work_wait, is_completed = c10d.Work.wait, c10d.Work.is_completed
        get_future, future = c10d.Work.get_future, torch._C.Future
        f_wait, f_value, f_done, f_then = future.wait, future.value, future.done, future.then
        collect_all = torch._C._collect_all

        def wait(work, *args, **kwargs):
            ledger._mark_work(work)
            return work_wait(work, *args, **kwargs)

        def completed(work):
            done = is_completed(work)
            if done:
                ledger._mark_work(work)
            return done

        def future_of(work):
            fut = get_future(work)
            ledger._kept.append(work)
            ledger._own(fut, (id(work),))
            return fut

        def waited(method):
            def through(fut, *args, **kwargs):
                ledger._mark_future(fut)
                return method(fut, *args, **kwargs)
            return through

        def done(fut):
            finished = f_done(fut)
            if finished:
                ledger._mark_future(fut)
            return finished

        def then(fut, callback):
            chained = f_then(fut, callback)
            ledger._own(chained, ledger._owner.get(id(fut), ()))
            return chained

        def collected(futures):
            together = collect_all(futures)
            ledger._own(together, sum((ledger._owner.get(id(f), ()) for f in futures), ()))
            return together

        with contextlib.ExitStack() as stack:
            for target, name, value in (
                    (c10d.Work, "wait", wait), (c10d.Work, "is_completed", completed),
                    (c10d.Work, "get_future", future_of), (future, "wait", waited(f_wait)),
                    (future, "value", waited(f_value)), (future, "done", done),
                    (future, "then", then), (torch._C, "_collect_all", collected)):
                stack.enter_context(replaced(target, name, value))
            yield

    def __enter__(self) -> "WaitLedger":
        self._stack = contextlib.ExitStack()
        self._stack.enter_context(self._patched())
        return self

    def __exit__(self, *exc) -> None:
        self._stack.close()
