"""What a run amounts to, once it is over.

Read in this order: ``rank_state`` (what the launcher knows of a rank while the run goes
on) -> ``record`` (the finished run, whichever launcher ran it) -> ``outcome`` (the values,
or the error naming the root-cause rank; ``signs``: what an error's message says of its
cause) -> ``everywhere`` (the same error on every rank: no root cause) -> ``timeouts``
(ranks that timed out are victims of the rank that never joined their collective) ->
``stacks`` (where a stuck rank waited) -> ``died_after_return`` (a rank that died after its
code returned) -> ``skips`` (a run whose ranks all skipped themselves). ``plain_values``:
the values read as plain data only, for a caller (a checker) that must not run its ranks'
code.
"""
