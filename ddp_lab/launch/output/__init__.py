"""The ranks' output, from their pipes to the cell and to ``res.logs``.

Read in this order: ``reader`` (the one reader of child output: pipes to whole lines per
rank or agent, progress bars as a status) -> ``kept_log`` (what the kernel keeps of each
rank's lines for ``res.logs``: head and tail, bounded) -> ``echo`` (the one writer to the
cell: lines tagged ``[rank N]``, batched under Jupyter's rate limits) -> ``heartbeat`` (a
sign of life for long runs, written through the echo) -> ``run_loop`` (the one loop that
reads, shows and does what is due, shared by the fork-server session, live calls, the
torchrun session and the runner of torchrun agents).
"""
