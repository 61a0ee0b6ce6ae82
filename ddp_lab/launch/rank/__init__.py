"""What runs inside a rank. It imports nothing of the launcher but ``config`` (what the
kernel and the ranks share) and ``errors``: a rank stays light, and what it does can be read
without the kernel's side.

Read in this order: ``main`` (a forked process becomes a rank: environment, lifeline,
stack dump, process group, the user's function or script, its result or error; also
``ddp_lab.report``) -> ``failure`` (what the launcher learns of a failure: one typed
record, plain JSON on disk) -> ``teardown`` (why destroyed process groups are kept until
the code returned) -> ``pinned_rendezvous`` (``ddp_lab.spawn``'s ranks: rendezvous pinned
to the run's store) -> ``cell`` (a ``%%ddp`` cell on a rank) -> ``progress``
(``ddp_lab.progress``). A live rank's loop of calls is ``live/rank_loop.py``, given to
``main`` as its body.
"""
