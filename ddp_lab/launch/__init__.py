"""The launcher: runs a function or a script on several ranks from a notebook or a terminal.

Read it in the order a run flows: ``api`` (run, run_script; ``spawn``/``spawn_context``:
the mp.spawn drop-in; ``payload``: what travels to the ranks) -> ``checks`` (bad input,
before any process; ``backends``: what "auto" picks) -> ``config`` (what the caller and the
ranks share: settings, the run folder) -> ``environment`` (what every rank's environment
holds) -> ``session`` (one run: fork server, rendezvous, output, deadline) ->
``spawner``/``zygote``/``channel`` (the fork server) -> ``worker`` (inside a rank) ->
``output`` (the one reader of child output) -> ``ranks``/``echo`` (live output) ->
``heartbeat``/``stacks`` (hangs) -> ``record`` (a finished run) -> ``outcome``/``errors``
(values or the root-cause error; ``exit_abort``: a rank that died after its code returned).
``magic`` and ``cell`` give ``%%ddp``; ``live/`` keeps ranks alive across calls
(``ddp_lab.Ranks``, ``%ddp_ranks``, ``%%ranks``) on the same session; ``torchrun/`` runs
the same promises on torch's own elastic agent.

Nothing is imported here: ranks import ``ddp_lab.launch.worker`` and must stay light.
"""
