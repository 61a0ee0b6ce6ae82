"""``network=``: a run on shaped links instead of loopback, and the run's rendezvous.

Read in this order: ``setting`` (``ddp_lab.Network``, its checks, and the probe that says
whether this machine can build it) -> ``switch`` (the fork server's bridge, one namespace
and one shaped link per rank) -> ``rendezvous`` (the run's TCPStore, bound by us to
loopback, or to a shaped run's bridge).
"""
