"""Notebook 15: train through failures and slow links (resharded checkpoints, a replica
group that loses a member, LocalSGD and DiLoCo, a quantized all-reduce)."""
