"""Notebook 06: the digits CNN trained with DDP, throughput against world size."""
