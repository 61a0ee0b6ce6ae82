"""Optional resource limits for every rank: ``DDP_LAB_RANK_LIMITS="memory=4G,cpu=600"``.

Why: on a shared server one learner's runaway rank (a tensor a thousand times too large, an
endless loop, a log file filling the disk) takes memory, cores and disk from everyone. An
administrator sets the variable for every kernel (or a learner in ``env=``); each rank then
runs under these ``setrlimit`` limits, which its children inherit, and exceeding one fails
that rank alone with an error that says so (MemoryError or torch's "can't allocate memory",
SIGXCPU, SIGXFSZ), reported as any other crash.
https://man7.org/linux/man-pages/man2/getrlimit.2.html

- ``memory``: bytes of data (heap and private mappings, RLIMIT_DATA; not RLIMIT_AS, which
  counts the address space torch reserves without using it);
- ``cpu``: seconds of CPU time (RLIMIT_CPU);
- ``file_size``: bytes of the largest file a rank may write (RLIMIT_FSIZE);
- ``open_files``: descriptors (RLIMIT_NOFILE).

Sizes take K, M, G or T (powers of 1024). A limit never raises what the system already
allows: the lower of the two applies.
"""

from __future__ import annotations

import re
import resource

LIMITS_VAR = "DDP_LAB_RANK_LIMITS"
KINDS = {"memory": resource.RLIMIT_DATA, "cpu": resource.RLIMIT_CPU,
         "file_size": resource.RLIMIT_FSIZE, "open_files": resource.RLIMIT_NOFILE}
SIZED = ("memory", "file_size")
UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}
EXAMPLE = f'{LIMITS_VAR}="memory=4G,cpu=600,file_size=1G,open_files=4096"'


def parse_limits(text: str) -> tuple[tuple[str, int], ...]:
    """``"memory=4G,cpu=600"`` -> (("memory", 4294967296), ("cpu", 600)); ValueError that
    says what is wrong and shows a good value."""
    limits = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        name, _, value = (piece.strip() for piece in item.partition("="))
        if name not in KINDS:
            raise ValueError(f"{LIMITS_VAR}: unknown limit {name!r}; the limits are "
                             f"{', '.join(KINDS)}, e.g. {EXAMPLE}")
        limits[name] = _amount(name, value)
    return tuple(sorted(limits.items()))


def _amount(name: str, value: str) -> int:
    match = re.fullmatch(r"(\d+)\s*([KMGT]?)B?" if name in SIZED else r"(\d+)()", value.upper())
    if not match or int(match[1]) <= 0:
        unit = "a size such as 4G or 512M" if name in SIZED else "a positive whole number"
        raise ValueError(f"{LIMITS_VAR}: {name}={value!r} is not {unit}, e.g. {EXAMPLE}")
    return int(match[1]) * UNITS[match[2]]


def apply_limits(limits: tuple[tuple[str, int], ...], pid: int = 0) -> None:
    """Set each limit on process ``pid`` (0: this one), soft and hard (the rank's code may
    not raise it again), never above the hard limit it already has. CPU time's hard limit
    is a second later: at the soft one the kernel sends SIGXCPU, which names the cause; at
    the hard one, SIGKILL, which does not."""
    for name, value in limits:
        kind = KINDS[name]
        _, hard = resource.prlimit(pid, kind) if pid else resource.getrlimit(kind)
        cap = (lambda v: v) if hard == resource.RLIM_INFINITY else (lambda v: min(v, hard))
        pair = (cap(value), cap(value + 1 if name == "cpu" else value))
        if pid:
            resource.prlimit(pid, kind, pair)
        else:
            resource.setrlimit(kind, pair)
