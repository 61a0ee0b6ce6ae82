"""What the controller (the notebook's kernel) and a host's agent say to each other over
their channel (channel.py: authenticated before anything is unpickled).

The controller asks: ``OpenStore`` (the first host only), ``Begin`` a session of the
host's ranks (its call 0: the group is up), ``CallDown`` (a live call's bodies for the
host's ranks), ``Hurry`` (a rank failed elsewhere), ``Stop`` (the stop button), ``End``
(close the session). The agent answers ``Hello`` once, ``StoreOpen``, ``Lines`` (the
ranks' output, live), ``CallDone`` (a call's outcome on this host), ``Ended``, or
``Failed`` (what went wrong, in words). Both send a beat every ``BEAT_S``: a side that
hears nothing for ``SILENCE_S`` takes the link for cut.

Times cross machines as ages (seconds before the message was sent): each machine's
``time.monotonic()`` counts from its own boot.
"""

from __future__ import annotations

import pickle
import time
from dataclasses import dataclass, field

BEAT = "beat"
MESSAGE = "message"
BEAT_S = 1.0
SILENCE_S = 10.0  # nine beats missed: the link is cut or the peer stopped (not a long
# pickling in the kernel, which holds the GIL from the beat thread for a second or two)


@dataclass(frozen=True)
class Hello:
    host_index: int
    address: str    # the agent's end of the channel: the host's address on that network
    interface: str  # the interface that carries it (gloo's GLOO_SOCKET_IFNAME)
    hostname: str
    pid: int


@dataclass(frozen=True)
class OpenStore:
    world_size: int


@dataclass(frozen=True)
class StoreOpen:
    address: tuple[str, int]


@dataclass(frozen=True)
class Begin:
    """Start this host's ranks: ``nproc`` of them from ``first_rank`` on."""

    first_rank: int
    nproc: int
    world_size: int
    host_count: int
    backend: str
    timeout: float
    env: dict
    store: tuple[str, int]
    cwd: str
    sys_path: tuple = ()  # the notebook's import path (its modules, pickled by reference)


@dataclass(frozen=True)
class CallDown:
    seq: int
    kind: str
    bodies: dict  # global rank -> body (live/frames.Call)
    timeout: float


@dataclass(frozen=True)
class Stop:
    seq: int


@dataclass(frozen=True)
class Hurry:
    """A rank of the call failed on another host ``failed_age`` seconds ago: the grace
    after a first failure starts for this host's ranks too."""

    seq: int
    failed_age: float


@dataclass(frozen=True)
class End:
    pass


@dataclass(frozen=True)
class Ended:
    pass


@dataclass(frozen=True)
class Lines:
    rank: int
    lines: list
    status: str | None


@dataclass(frozen=True)
class RankEnd:
    """How one of the host's ranks stands after a call (a live rank's ``RankState``)."""

    rank: int
    exitcode: int | None
    exit_age: float | None  # seconds since it exited, None: it runs
    stopped_by_launcher: bool
    failure: dict | None  # a dead rank's record (rank/failure.py), as plain data


@dataclass(frozen=True)
class CallDone:
    """A call's outcome on one host, in global ranks (live/session.CallState's fields)."""

    seq: int
    replies: dict  # rank -> live/frames.Reply
    stuck: list
    stacks: dict
    died: list
    lost: str | None  # why the host's ranks can take no more calls
    ranks: list = field(default_factory=list)  # RankEnd of each of the host's ranks
    first_failure_age: float | None = None


@dataclass(frozen=True)
class Failed:
    what: str


def dumps(message) -> bytes:
    return pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)


def age(when: float | None, now: float | None = None) -> float | None:
    """A monotonic time of this machine as seconds before ``now``."""
    return None if when is None else (time.monotonic() if now is None else now) - when


def since(seconds_ago: float | None) -> float | None:
    """An age as a monotonic time of this machine."""
    return None if seconds_ago is None else time.monotonic() - seconds_ago


def failure_timed(failure, convert):
    """A failure record as plain data (rank/failure.py) with its time passed through
    ``convert`` (``age`` on a host, ``since`` at the controller); anything else as it is."""
    if isinstance(failure, dict) and isinstance(failure.get("time"), (int, float)):
        return {**failure, "time": convert(failure["time"])}
    return failure
