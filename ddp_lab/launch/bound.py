"""How long a run may take past its timeout, and the waits that make up that slack.

``run()`` ends within ``timeout`` + ``BOUND_SLACK_S`` whatever the ranks or the fork server
do (once a new server is ready: its import of torch is not on the run's clock, see
``spawner.ForkServer.wait_ready``). Each wait below is as short as it can be without cutting
off a healthy run on busy cores; their worst chain must fit in the slack with room to spare.
"""

from __future__ import annotations

from ddp_lab.launch.spawner import SEND_TIMEOUT_S

FAILURE_GRACE_S = 2.0   # after a rank fails, peers get this long to fail on their own
STACK_WAIT_S = 2.0      # how long to wait for stuck ranks to write their stacks
INTERRUPT_WAIT_S = 3.0  # live ranks sent SIGINT (stop button, a hang) get this long to reply
KILL_WAIT_S = 3.0       # killed ranks not reported gone by then: the fork server is wedged
END_WAIT_S = 3.0        # for the fork server to put the run's leftovers down (reaper.GRACE_S)
DRAIN_QUIET_S = 0.5     # after the last rank exited, a pipe its child holds may be this quiet
START_SLACK_S = 4.0     # starting the ranks may eat this much into the deadline's slack
BOUND_SLACK_S = 15.0    # the call ends by timeout + this, whatever happens
# The longest chain of waits after the deadline: a slow start, stacks, killed ranks, then the
# end of the run (or a send to a wedged server, which abandons it at once). The rest of the
# slack is for work: killing a process tree, removing the run folder.
WORST_CASE_WAITS_S = (START_SLACK_S + STACK_WAIT_S + KILL_WAIT_S
                      + max(END_WAIT_S, SEND_TIMEOUT_S))
