"""Notebook 11: device meshes, DTensor placements and redistribute, tensor parallel from
scratch and with parallelize_module, 2-D parallelism, pipeline schedules.

Notebook 11b: torch.distributed.pipelining's schedules on a paced model (``pipe_model``,
``pipelining``), each rank's recorded orders replayed with ideal costs (``replay``), and
their timelines (``pipelining_plots``)."""
