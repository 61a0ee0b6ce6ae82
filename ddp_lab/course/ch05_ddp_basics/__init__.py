"""Notebook 05: what DDP synchronizes, equivalence with one process, seeds, sampling, checkpoints."""
