"""Where a run's ranks talk: a private network of their own, shaped links (``network=``), and
the run's rendezvous.

Read in this order: ``placement`` (where a run's ranks live, on loopback or on shaped
links: one object, chosen when the run is checked, that the launcher asks instead of
branching on ``network=``) -> ``isolation`` (every run in a network namespace of its own,
so no other user or host reaches its ports; ``DDP_LAB_ISOLATION``) with ``namespaces``
(the stdlib helper that makes them, run as a command prefix) -> ``setting``
(``ddp_lab.Network``, its checks, and the probe that says whether this machine can build
it) -> ``switch`` (the fork server's bridge, one namespace and one shaped link per rank) ->
``rendezvous`` (the run's TCPStore, bound by us to loopback, or to a shaped run's bridge).
"""
