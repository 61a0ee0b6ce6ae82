"""What travels to the ranks: the user's function and arguments, pickled by value, with
their source file names kept so that a rank's traceback quotes the notebook's lines.

cloudpickle (3.1 and later) rebuilds every code object it ships by value under the file
name ``<dynamic-code>`` ("deterministic payloads", cloudpickle's ``_code_reduce``), so a
traceback from a notebook-defined function read ``File "<dynamic-code>", line 7, in
demo_basic`` with no source line: the cell's lines, which travel with the payload, are
filed under the cell's own name (``/tmp/ipykernel_PID/HASH.py``). Code objects are
pickled here with ``marshal`` instead, the format of ``.pyc`` files: it keeps every
field, the file name included, whatever the pickler would have written. The ranks run
the same interpreter (forked from this venv's fork server), so marshal's format matches.
"""

from __future__ import annotations

import io
import linecache
import marshal
import types
from collections import ChainMap

import cloudpickle


class _Pickler(cloudpickle.Pickler):
    """cloudpickle, except that code objects keep their ``co_filename``."""

    dispatch_table = ChainMap({types.CodeType: lambda code: (marshal.loads,
                                                             (marshal.dumps(code),))},
                              cloudpickle.Pickler.dispatch_table)


def dumps(obj) -> bytes:
    """``cloudpickle.dumps(obj)`` with code objects' file names kept; read it back with
    plain ``pickle.loads`` (or ``cloudpickle.loads``)."""
    buffer = io.BytesIO()
    _Pickler(buffer, protocol=cloudpickle.DEFAULT_PROTOCOL).dump(obj)
    return buffer.getvalue()


def remember_source(filename: str, source: str) -> None:
    """A linecache entry for code that has no file (a cell), so that tracebacks and stack
    reports can quote its lines; ``interactive_sources`` (api.py) ships such entries."""
    linecache.cache[filename] = (len(source), None, source.splitlines(keepends=True), filename)
