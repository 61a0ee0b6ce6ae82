"""Notebook 04 cell 26: "gloo's built-in [slows down] hardly at all" with 2 OpenMP threads
per rank (4 ranks, 16 MiB). The notebook's own sweep code, ring and gloo only, run twice.
Run: flock /tmp/ddp-lab-cpu.lock .venv/bin/python docs/reviews/repro/04_threads_gloo.py"""
from dataclasses import replace

from ddp_lab.course.ch04_allreduce.sweep import MiB, SweepConfig, measure_sweep

config = SweepConfig(sizes=(16 * MiB,), algorithms=("ring", "gloo"), large_repeats=2, bursts=3)
for attempt in (1, 2):
    one = measure_sweep(replace(config, threads=1), world_sizes=(4,))
    many = measure_sweep(replace(config, threads=2), world_sizes=(4,))
    print(f"attempt {attempt}: " + ", ".join(
        f"{a} {one.seconds(4, a, 16 * MiB) * 1e3:.1f} -> {many.seconds(4, a, 16 * MiB) * 1e3:.1f} ms"
        f" ({many.seconds(4, a, 16 * MiB) / one.seconds(4, a, 16 * MiB):.2f}x)" for a in ("ring", "gloo")))
