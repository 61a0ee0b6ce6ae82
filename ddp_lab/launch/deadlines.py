"""Every wait of a run, in one place, and how long a run may take past its timeout.

``run()`` ends within ``timeout`` + ``BOUND_SLACK_S`` whatever the ranks or the fork server
do (once a new server is ready: its import of torch is not on the run's clock, see
``ForkServer.wait_ready`` in forkserver/client.py). Each wait below is as short as it can be
without cutting off a healthy run on busy cores; their worst chain must fit in the slack
with room to spare.
"""

from __future__ import annotations

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
