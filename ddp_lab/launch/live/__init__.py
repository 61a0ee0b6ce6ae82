"""Live ranks: processes that keep their namespace and process group across calls.

Read in this order: ``frames`` (the messages between the kernel and a rank, and how they
travel), ``rank_loop`` (what a live rank does between and during calls: ``rank/main``'s
body in a live rank), ``session`` (the kernel's side of one call: send, read output and
replies, and what a failure, a hang or the stop button does), ``outcome`` (a call's values,
or its error judged as a one-shot run's by ``verdict/outcome``), ``handle`` (the public
``ddp_lab.Ranks``), ``magic_options`` (what the magics share), ``magics`` (``%ddp_ranks`` and ``%%ranks``). The processes themselves
are started, watched and cleaned up by the same fork server and ``Session`` as a one-shot
``ddp_lab.run``.
"""
