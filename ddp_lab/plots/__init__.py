"""Figures drawn from real results: one module per topic, each function takes results and
returns a matplotlib Figure (never plt.show()), so notebooks display it and tests inspect it.

A bare Figure (made without pyplot) has no notebook display of its own unless the inline
backend happens to be active, so importing this package in a kernel registers one.
"""

import sys

from matplotlib.figure import Figure

from ddp_lab.plots.allreduce import allreduce_curves, bytes_per_rank, ring_steps, threads_effect
from ddp_lab.plots.bandwidth import latency_bandwidth
from ddp_lab.plots.ddp_basics import (anatomy_picture, dropout_masks, epoch_orders,
                                     equivalence_plot, resume_plot, shard_coverage)
from ddp_lab.plots.collectives import collective_picture, results_picture, timing_bars
from ddp_lab.plots.ddp_costs import accumulation_bars, hook_curves, memory_bars, option_bars
from ddp_lab.plots.failures import recovery_losses, step_times
from ddp_lab.plots.inside_ddp import bucket_map, overlap_timeline, sweep_curve
from ddp_lab.plots.launch import launch_latency
from ddp_lab.plots.timeline import rank_timeline
from ddp_lab.plots.torchrun import elastic_timeline
from ddp_lab.plots.training import digit_samples, loss_curves, scaling

__all__ = ["launch_latency", "latency_bandwidth", "collective_picture", "results_picture",
           "timing_bars", "rank_timeline", "allreduce_curves", "bytes_per_rank", "ring_steps",
           "threads_effect", "digit_samples", "loss_curves", "scaling", "anatomy_picture",
           "dropout_masks", "epoch_orders", "equivalence_plot", "resume_plot", "shard_coverage", "bucket_map",
           "sweep_curve", "overlap_timeline", "hook_curves", "accumulation_bars", "memory_bars",
           "option_bars", "elastic_timeline", "recovery_losses", "step_times"]


def _show_figures_in_notebooks() -> None:
    ipython = sys.modules.get("IPython")
    shell = ipython.get_ipython() if ipython else None
    if shell is None:
        return
    from IPython.core.pylabtools import print_figure
    png = shell.display_formatter.formatters["image/png"]
    png.for_type(Figure, lambda fig: print_figure(fig, "png", bbox_inches="tight"))


_show_figures_in_notebooks()
