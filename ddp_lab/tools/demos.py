"""One demo module per notebook. ``DEMOS`` maps the names ``ddp-lab run NAME`` accepts to
the function each rank calls; later notebooks add their entries here. ``ddp-lab run --help``
describes each demo with a line written for the user (tools/cli/demo_lines.py, kept in step
with these names by tests/tools/test_cli_help.py); nothing here imports torch until a demo
is loaded."""

from __future__ import annotations

import importlib

DEMOS = {
    "hello": "ddp_lab.course.ch00_launching.launching:hello",
    "all_reduce": "ddp_lab.course.ch00_launching.launching:all_reduce_ranks",
    "crash": "ddp_lab.course.ch00_launching.launching:crash_on_last_rank",
    "hang": "ddp_lab.course.ch00_launching.launching:hang_without_rank0",
    # 01 processes, ranks, stores
    "subgroups": "ddp_lab.course.ch01_processes.processes:subgroups",
    "backends": "ddp_lab.course.ch01_processes.processes:probe_backends",
    "barrier_timeline": "ddp_lab.course.ch01_processes.processes:barrier_timeline",
    "print_freely": "ddp_lab.course.ch01_processes.processes:print_freely",
    "dprint": "ddp_lab.course.ch01_processes.processes:print_in_rank_order",
    # 04 all-reduce from scratch
    "ring_trace": "ddp_lab.course.ch04_allreduce.allreduce:ring_trace",
    "allreduce_check": "ddp_lab.course.ch04_allreduce.allreduce:compare_with_builtin",
    "allreduce_sweep": "ddp_lab.course.ch04_allreduce.sweep:time_sweep",  # ~10-20 s
    # 02 point to point
    "send_recv": "ddp_lab.course.ch02_point_to_point.point_to_point:nonblocking_send_recv",
    "recv_any": "ddp_lab.course.ch02_point_to_point.point_to_point:recv_from_any",
    "ring": "ddp_lab.course.ch02_point_to_point.point_to_point:ring_token",
    "deadlock": "ddp_lab.course.ch02_point_to_point.point_to_point:send_then_recv",  # hangs: use --timeout 3
    "exchange": "ddp_lab.course.ch02_point_to_point.point_to_point:nonblocking_exchange",
    "ping_pong": "ddp_lab.course.ch02_point_to_point.point_to_point:ping_pong",
    # 03 collectives
    "collectives": "ddp_lab.course.ch03_collectives.collectives:tour",
    "broadcast": "ddp_lab.course.ch03_collectives.collectives:broadcast",
    "reduce": "ddp_lab.course.ch03_collectives.collectives:reduce",
    "gather": "ddp_lab.course.ch03_collectives.collectives:gather",
    "all_gather": "ddp_lab.course.ch03_collectives.collectives:all_gather",
    "scatter": "ddp_lab.course.ch03_collectives.collectives:scatter",
    "reduce_scatter": "ddp_lab.course.ch03_collectives.collectives:reduce_scatter",
    "all_to_all": "ddp_lab.course.ch03_collectives.collectives:all_to_all",
    "reduce_ops": "ddp_lab.course.ch03_collectives.support:try_reduce_ops",
    "objects": "ddp_lab.course.ch03_collectives.costs:object_collectives",
    "barrier": "ddp_lab.course.ch03_collectives.costs:barrier_release",
    # 05 DDP basics
    "ddp_basic": "ddp_lab.course.ch05_ddp_basics.basics:tutorial_basic_example",
    "ddp_anatomy": "ddp_lab.course.ch05_ddp_basics.basics:anatomy_of_a_step",
    "ddp_buffers": "ddp_lab.course.ch05_ddp_basics.basics:buffers_in_forward",
    "ddp_straggler": "ddp_lab.course.ch05_ddp_basics.basics:straggle_at",  # hangs: use --timeout 5
    "ddp_model_parallel": "ddp_lab.course.ch05_ddp_basics.basics:model_parallel_step",
    "ddp_seeds": "ddp_lab.course.ch05_ddp_basics.seeds:seeding_experiment",
    "sampler": "ddp_lab.course.ch05_ddp_basics.sampling:sampler_indices",
    "eval_padding": "ddp_lab.course.ch05_ddp_basics.sampling:evaluate_three_ways",
    # 06 training a CNN
    "train_cnn": "ddp_lab.course.training:train",  # 10 epochs on the digits, ~10 s on 2 ranks
    "step_throughput": "ddp_lab.course.ch06_training.throughput:step_throughput",
    # 07 inside DDP
    "buckets": "ddp_lab.course.ch07_inside_ddp.buckets:show_buckets",
    "overlap": "ddp_lab.course.ch07_inside_ddp.overlap:overlap_summary",
    "comm_hooks": "ddp_lab.course.ch07_inside_ddp.comm_hooks:hook_summary",
    "no_sync": "ddp_lab.course.ch07_inside_ddp.accumulation:accumulation_counts",
    "unused_params": "ddp_lab.course.ch07_inside_ddp.unused_params:train_two_heads",
    "bucket_views": "ddp_lab.course.ch07_inside_ddp.memory:where_gradients_live",
    # 08 when it breaks
    "uneven_hang": "ddp_lab.course.ch08_when_it_breaks.uneven_inputs:uneven_training",  # hangs: -n 3 --timeout 5
    "monitored_barrier": "ddp_lab.course.ch08_when_it_breaks.mismatches:stuck_ranks_at_barrier",  # -n 4
    # 09 torchrun and multi-node
}


# Demos that hang on purpose (a rank never joins): their default --timeout is short, so that
# the WorkerTimeout with every rank's stack comes in seconds, not after the usual 60 s.
HANGS_ON_PURPOSE = {"hang": 5.0, "deadlock": 5.0, "ddp_straggler": 5.0, "uneven_hang": 5.0}
DEFAULT_TIMEOUT = 60.0


def default_timeout(name: str) -> float:
    return HANGS_ON_PURPOSE.get(name, DEFAULT_TIMEOUT)


def load_demo(name: str):
    """The worker function behind a demo name, or a ValueError listing the names."""
    if name not in DEMOS:
        raise ValueError(f"unknown demo {name!r}; choose one of: {', '.join(sorted(DEMOS))}")
    module, function = DEMOS[name].split(":")
    return getattr(importlib.import_module(module), function)
