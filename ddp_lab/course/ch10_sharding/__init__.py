"""Notebook 10: sharding the model state: ZeRO 1-3 from the collectives, torch's
ZeroRedundancyOptimizer and FSDP2, memory per rank, sharded checkpoints."""
