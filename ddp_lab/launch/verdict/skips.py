"""A run that "succeeded" because every rank skipped itself: say so.

Published examples guard their GPU count and leave quietly when it is short:
pytorch/examples' distributed/ddp/example.py prints "Unable to locate sufficient 2 gpus to
run this example. Exiting." and calls ``sys.exit()``, whose status is 0. Under torchrun,
mp.spawn or ddp_lab that is a success, and ``res.values`` is ``[None, None]``: nothing ran,
and nothing says so. The warning needs both signs, so a function that merely returns None
(most do) never raises it: every rank returned None, and some rank printed a line that
talks about GPUs (or devices, accelerators) and about leaving (exit, skip).
"""

from __future__ import annotations

import re
import warnings

_DEVICE_WORDS = re.compile(r"\b(gpus?|cuda|devices?|accelerators?)\b", re.I)
_LEAVING_WORDS = re.compile(r"\b(exit|exiting|skip|skipping|skipped)\b", re.I)


class SkippedRunWarning(UserWarning):
    """Every rank returned None after printing that it skips (a GPU-count guard)."""


# Shown every time, not once per code location: the location is always the launcher's, so
# Python's default would hide every skipped run after the first in a kernel.
warnings.simplefilter("always", SkippedRunWarning)


def skip_line(logs: list[str]) -> tuple[int, str] | None:
    """(rank, line) of the first line that says a rank left for want of devices."""
    for rank, log in enumerate(logs):
        for line in log.splitlines():
            if _DEVICE_WORDS.search(line) and _LEAVING_WORDS.search(line):
                return rank, line.strip()
    return None


def warn_if_skipped(result, stacklevel: int = 4):
    """Warn about a result whose ranks all returned None after a skip line; return it.
    ``stacklevel`` counts to the user's call (this, launch, run or spawn, the caller)."""
    found = skip_line(result.logs) if all(v is None for v in result.values) else None
    if found is not None:
        rank, line = found
        warnings.warn(
            f"every rank returned None, and rank {rank} printed {line!r}: the code skipped "
            "itself (a GPU-count guard that exits with status 0) instead of running. On a "
            "CPU-only machine remove the guard, or make it count CPU ranks (docs/porting.md: "
            "Porting published examples).", SkippedRunWarning, stacklevel=stacklevel)
    return result
