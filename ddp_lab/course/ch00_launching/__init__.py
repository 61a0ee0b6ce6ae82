"""Notebook 00: why mp.spawn fails in a kernel, ddp_lab.run, launch latency."""
