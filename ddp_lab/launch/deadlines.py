"""Every wait of a run, in one place; how long a run may take past its timeout; and the one
policy that says when a run must end (``Deadline``).

``run()`` ends within ``timeout`` + ``BOUND_SLACK_S`` whatever the ranks or the fork server
do (once a new server is ready: its import of torch is not on the run's clock, see
``ForkServer.wait_ready`` in forkserver/client.py). Each wait below is as short as it can be
without cutting off a healthy run on busy cores; their worst chain must fit in the slack
with room to spare.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

# -- a run (session.py, live/session.py) ----------------------------------------------------
FAILURE_GRACE_S = 2.0   # after a rank fails, peers get this long to fail on their own
STACK_WAIT_S = 2.0      # how long to wait for stuck ranks to write their stacks
INTERRUPT_WAIT_S = 3.0  # live ranks sent SIGINT (stop button, a hang) get this long to reply
KILL_WAIT_S = 3.0       # killed ranks not reported gone by then: the fork server is wedged
END_WAIT_S = 3.0        # for the fork server to put the run's leftovers down (LEFTOVER_GRACE_S)
DRAIN_QUIET_S = 0.5     # after the last rank exited, a pipe its child holds may be this quiet
START_SLACK_S = 4.0     # starting the ranks may eat this much into the deadline's slack
BOUND_SLACK_S = 15.0    # the call ends by timeout + this, whatever happens
CALL_SEND_WAIT_S = 2.0  # an idle live rank reads its call at once; a full pipe this long: gone
FIRST_BEAT_S = 10.0     # the first heartbeat line of a long run; then at 20 s, 40 s, ...

# -- the fork server (forkserver/) ------------------------------------------------------------
SPAWN_REPLY_TIMEOUT = 120.0  # a new server may take this long to import torch (busy cores)
SEND_TIMEOUT_S = 2.0    # a server that reads nothing for this long is wedged (or SIGSTOPped)
CLOSE_WAIT_S = 10.0     # how long a closed server gets to put its runs' leftovers down
LEFTOVER_GRACE_S = 1.0  # SIGTERM -> SIGKILL for a rank's leftover helpers
SERVER_POLL_S = 0.05    # the server's loop while leftovers are put down or a launcher waits

# -- torchrun (torchrun/) ---------------------------------------------------------------------
TORCHRUN_STACK_WAIT_S = 3.0  # stuck workers get this long to print their stacks after SIGABRT
AGENTS_DRAIN_S = 1.0    # after a stop, how long to collect what the killed agents had printed

# The longest chain of waits after the deadline: a slow start, stacks, killed ranks, then the
# end of the run (or a send to a wedged server, which abandons it at once). The rest of the
# slack is for work: killing a process tree, removing the run folder.
WORST_CASE_WAITS_S = (START_SLACK_S + STACK_WAIT_S + KILL_WAIT_S
                      + max(END_WAIT_S, SEND_TIMEOUT_S))


# -- the policy: when a run must end --------------------------------------------------------
TIMED_OUT = "timed out"    # the deadline passed and no rank had failed: stacks, then stop all
GRACE_OVER = "grace over"  # a rank failed and its peers' grace (or the deadline) is over


@dataclass(frozen=True)
class Deadline:
    """When a run (or one call to live ranks) must end: ``timeout`` seconds after
    ``started`` but never past ``limit``, or ``grace`` seconds after its first failure,
    whichever comes first (``grace=None``: failures do not shorten it). A pure policy: the
    fork-server session, live calls, the torchrun session and the agents runner all ask it,
    and tests call it directly."""

    started: float
    timeout: float
    limit: float = math.inf
    grace: float | None = FAILURE_GRACE_S

    def ends_at(self, first_failure: float | None = None) -> float:
        end = min(self.started + self.timeout, self.limit)
        if first_failure is None or self.grace is None:
            return end
        return min(end, first_failure + self.grace)

    def due(self, now: float, first_failure: float | None = None) -> str | None:
        """None while the run may go on, else why it must stop now: TIMED_OUT or GRACE_OVER."""
        if now < self.ends_at(first_failure):
            return None
        return TIMED_OUT if first_failure is None else GRACE_OVER


@dataclass(frozen=True)
class StartClock:
    """A fork-server run's clock, started once the server is ready (a new one imports torch
    first: seconds, many more on busy cores, which are not the run's and must not eat a
    short timeout). Starting the ranks may take ``START_SLACK_S`` of the slack; waiting for
    the server's answers while setting up ends by ``setup_until``."""

    entered: float
    timeout: float

    @property
    def limit(self) -> float:
        return self.entered + self.timeout + START_SLACK_S

    @property
    def setup_until(self) -> float:
        return min(self.entered + SPAWN_REPLY_TIMEOUT, self.limit)

    def deadline(self, started: float) -> Deadline:
        """The run's deadline once its ranks have started at ``started``."""
        return Deadline(started, self.timeout, self.limit)
