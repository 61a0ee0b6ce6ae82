"""The launcher: runs a function or a script on several ranks from a notebook or a terminal.

The entry points are on top; everything else is in rooms that follow a run. Read
``ddp_lab.run`` from call to result in this order:

1. ``api`` (``run``, ``run_script``, ``launch``: what they share; the session
   contract ``RunSession``/``LiveRunSession`` and its one driver ``drive``), ``mp_spawn`` (``spawn``,
   the ``torch.multiprocessing.spawn`` drop-in), ``checks`` (bad input, before any process;
   ``backends``: what "auto" picks), ``payload`` (what travels to the ranks).
2. ``config`` (what the kernel and the ranks share: settings, one rank's instructions and
   the environment it starts with, the run folder).
3. ``session`` (one run, phase by phase: set-up, start, the run, cleanup) with ``deadlines``
   (every wait of a run, and ``Deadline``: the one policy that says when a run must end)
   and ``interrupts`` (Ctrl-C held back while a resource is created).
4. ``forkserver/`` (the process that forks the ranks: protocol, client, server, reaper,
   process tree).
5. ``rank/`` (inside a rank: ``main`` runs the user's code; imports nothing of the
   launcher but ``config`` and ``errors``).
6. ``output/`` (the one reader of the ranks' pipes, the one writer to the cell, heartbeat,
   and the one run loop every launcher shares).
7. ``verdict/`` (rank state, the run record, the outcome or its error, stacks) and
   ``errors`` (the exceptions a run raises).
8. ``network/`` (where a run's ranks live: ``placement``, asked instead of branching on
   ``network=``; every run's private network: ``isolation``; ``network=``: the setting,
   the switch; the rendezvous).
9. ``magic`` (``%%ddp``; its rank side is ``rank/cell``), ``live/`` (ranks kept alive
   across calls: ``ddp_lab.Ranks``, ``%ddp_ranks``, ``%%ranks``, on the same session; their
   loop of calls, ``live/rank_loop``, stays with live/ and is ``rank/main``'s body there),
   ``torchrun/`` (the same promises on torch's own elastic agent, and the runner of
   torchrun agents).
10. ``remote/`` (ranks on several hosts, ``hosts=[...]``: the channel between the notebook
   and an agent on each host, every message signed with the session's secret before
   anything reads it; the agent runs its host's share as a local live session; the
   controller's ``RemoteSession`` keeps the session contract across them).

Nothing is imported here: ranks import ``ddp_lab.launch.rank.main`` and must stay light.
"""
