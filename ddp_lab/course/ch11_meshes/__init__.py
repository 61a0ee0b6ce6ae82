"""Notebook 11: device meshes, DTensor placements and redistribute, tensor parallel from
scratch and with parallelize_module, 2-D parallelism, pipeline schedules."""
