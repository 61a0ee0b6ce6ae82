"""Ranks' values read as plain data only, for a caller that must not trust its ranks.

A rank's value comes back pickled, and unpickling runs whatever the pickle names: a class
defined in the rank's code (its ``__eq__``, ``__sub__`` or ``__float__`` then run in the
caller when the value is compared), or any importable callable with any arguments. That
is what ``ddp_lab.run`` is for in a notebook, where the ranks run the caller's own code. A
checker is different: the code in its ranks is the learner's, and the checker's process
holds what the ranks must not reach (the expected values; when grading, the key that signs
the results). While :func:`plain_values` is active, ``config.read_pickle`` reads with
:class:`PlainUnpickler`: Python's own numbers, strings, bytes and containers, and torch
tensors, parameters, dtypes and sizes (a tensor's storage through ``torch.load`` with
``weights_only=True``, torch's loader for untrusted files), NumPy arrays of numbers, and
the package's own dataclasses and named tuples. Anything else stops the read with
:class:`NotPlainData`, which names it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
import io
import pickle
import threading
import warnings

_ALLOWED = {
    ("builtins", name) for name in ("complex", "set", "frozenset", "slice", "range",
                                    "bytearray")
} | {
    ("collections", "OrderedDict"), ("copyreg", "_reconstructor"),
    ("torch._utils", "_rebuild_tensor_v2"), ("torch._utils", "_rebuild_parameter"),
    ("torch", "Size"), ("torch", "device"),
    ("numpy", "dtype"), ("numpy._core.numeric", "_frombuffer"),
    ("numpy.core.numeric", "_frombuffer"),
}
_active = threading.local()


class NotPlainData(pickle.UnpicklingError):
    """A rank's value named something that is not plain data (``.what``: module.name)."""

    def __init__(self, what: str):
        self.what = ("a class or function defined in the rank's own code"
                     if what.startswith("cloudpickle.") else what)
        super().__init__(f"{self.what} is not plain data")


@contextlib.contextmanager
def plain_values():
    """Within this block, in this thread, ranks' values are read as plain data only
    (:class:`PlainUnpickler`); their failure records always are (JSON: rank/failure.py)."""
    before = getattr(_active, "on", False)
    _active.on = True
    try:
        yield
    finally:
        _active.on = before


def loads(data: bytes):
    """``pickle.loads``, or :class:`PlainUnpickler`'s when :func:`plain_values` is active."""
    if getattr(_active, "on", False):
        return PlainUnpickler(io.BytesIO(data)).load()
    return pickle.loads(data)


class PlainUnpickler(pickle.Unpickler):
    """An unpickler that builds plain data and nothing else (see the module's docstring)."""

    def find_class(self, module: str, name: str):
        if (module, name) == ("torch.storage", "_load_from_bytes"):
            return _storage_from_bytes
        if (module, name) in _ALLOWED or _is_dtype(module, name):
            return super().find_class(module, name)
        if module.split(".")[0] == "ddp_lab":
            found = getattr(importlib.import_module(module), name, None)
            if _is_record_type(found):
                return found
        raise NotPlainData(f"{module}.{name}")


def _storage_from_bytes(data: bytes):
    import torch
    with warnings.catch_warnings():  # torch.save wrote it with the pickler's protocol, which
        warnings.filterwarnings("ignore", message="Detected pickle protocol")  # it reads
        return torch.load(io.BytesIO(data), weights_only=True)


def _is_dtype(module: str, name: str) -> bool:
    if module != "torch":
        return False
    import torch
    return isinstance(getattr(torch, name, None), torch.dtype)


def _is_record_type(found) -> bool:
    """The package's own dataclasses and named tuples: built field by field, nothing else
    runs (a class that pickle would call with arbitrary arguments is not one of them)."""
    return isinstance(found, type) and (
        dataclasses.is_dataclass(found) or (issubclass(found, tuple) and hasattr(found, "_fields")))
