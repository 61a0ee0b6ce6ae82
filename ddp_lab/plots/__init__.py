"""Figures drawn from real results: one module per topic, each function takes results and
returns a matplotlib Figure (never plt.show()), so notebooks display it and tests inspect it."""

from ddp_lab.plots.launch import launch_latency

__all__ = ["launch_latency"]
