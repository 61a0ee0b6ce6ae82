"""What a failed rank's error says of its cause, read from its message: a broken connection
(the usual way a peer's death shows up in gloo or NCCL: a knock-on failure), or a timeout
(it gave up waiting for peers: a victim of whoever was not there). Both the root-cause
verdict (``outcome``) and the timeout verdict (``timeouts``) ask; this is their one home.
"""

from __future__ import annotations

from ddp_lab.launch.rank.failure import RankFailure

KNOCK_ON_SIGNS = ("connection closed by peer", "connection reset by peer", "broken pipe",
                  "communicator was aborted", "socket closed", "distnetworkerror",
                  "connection refused", "read error", "recv error")
# gloo: "Timed out waiting 1000ms for recv operation", a store: "wait timeout after 1000ms",
# NCCL's watchdog: "collective operation timeout", a monitored barrier's "failed to pass"
TIMEOUT_SIGNS = ("timed out waiting", "wait timeout after", "collective operation timeout",
                 "failed to pass monitoredbarrier", "timed out after")


def looks_like_knock_on(record: RankFailure | None) -> bool:
    """Whether a rank's error is a broken connection (a peer's failure, seen from here)."""
    if record is None:
        return False
    text = record.headline.lower()
    return any(sign in text for sign in KNOCK_ON_SIGNS)


def is_timeout(record: RankFailure | None) -> bool:
    """Whether a rank's error says it gave up waiting for peers."""
    return record is not None and any(sign in record.message.lower()
                                      for sign in TIMEOUT_SIGNS)
