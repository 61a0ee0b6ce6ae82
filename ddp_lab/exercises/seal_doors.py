"""The doors the seal closes by patching (sealed.py): starting a thread, and the c10d store
(open to torch making a process group and to the checkers' instruments). ``state`` is the
seal's: ``state.seal`` (None while lifted), ``state.protected``, ``state.refuse(message)``."""

from __future__ import annotations

import contextlib
import inspect
import sys

from ddp_lab.exercises.seal_events import WHY


def close_threads(stack: contextlib.ExitStack, state) -> None:
    import _thread
    import threading
    refuse = _refuser(state, "threads", "starting a thread")
    for module, name in ((_thread, "start_new_thread"), (_thread, "start_joinable_thread"),
                         (threading, "_start_new_thread"),
                         (threading, "_start_joinable_thread")):
        if hasattr(module, name):
            stack.enter_context(_patched(module, name, refuse))


STORE_METHODS = ("set", "compare_set", "get", "add", "check", "delete_key", "num_keys", "wait",
                 "append", "multi_get", "multi_set", "queue_push", "queue_pop", "queue_len",
                 "list_keys", "barrier", "clone")


def close_store(stack: contextlib.ExitStack, state) -> None:
    from torch._C import _distributed_c10d as c10d
    for name in STORE_METHODS:
        if hasattr(c10d.Store, name):
            stack.enter_context(_patched(c10d.Store, name, _store_refuser(
                state, getattr(c10d.Store, name), f"Store.{name}")))
    for kind in ("TCPStore", "FileStore", "HashStore", "PrefixStore"):
        if hasattr(c10d, kind):
            cls = getattr(c10d, kind)
            stack.enter_context(_patched(cls, "__init__", _store_refuser(
                state, cls.__init__, f"a new {kind}")))


def _store_refuser(state, original, what: str):
    """The store door: closed to the learner's code, open to torch making a process group
    (``dist.new_group`` agrees on the group through the store) and to the checkers' own
    instruments (the seal lifted)."""
    def refuse_or_pass(*args, **kwargs):
        if state.seal is None or _making_a_group(state):
            return original(*args, **kwargs)
        state.refuse(f"{what} is closed in this exercise: {WHY['store']}")
    return refuse_or_pass


GROUP_MAKERS = ("new_group", "new_subgroups", "new_subgroups_by_enumeration", "split_group",
                "_new_group_with_tag", "init_device_mesh")


def _making_a_group(state) -> bool:
    """Whether torch's own code that makes a process group is on this stack."""
    import torch.distributed.distributed_c10d as c10d
    makers = {inspect.unwrap(getattr(c10d, name)).__code__ for name in GROUP_MAKERS
              if hasattr(c10d, name)}  # unwrapped: torch's loggers wrap each in one code
    frame = sys._getframe(2)
    while frame is not None and id(frame) not in state.protected:
        if frame.f_code in makers:
            return True
        frame = frame.f_back
    return False


def _refuser(state, door: str, what: str):
    def refuse(*args, **kwargs):
        state.refuse(f"{what} is closed in this exercise: {WHY[door]}")
    return refuse


@contextlib.contextmanager
def _patched(target, name: str, value):
    original = target.__dict__[name] if name in getattr(target, "__dict__", {}) else \
        getattr(target, name)
    setattr(target, name, value)
    try:
        yield
    finally:
        setattr(target, name, original)


