"""What ``ddp-lab run --help`` says of each demo: one line written for the user (what the
demo shows, and what to pass where it needs it), not a docstring cut to fit. The names are
``ddp_lab.tools.demos.DEMOS``'s; tests/tools/test_cli_help.py keeps the two in step."""

from __future__ import annotations

DEMO_LINES = {
    # 00 launching
    "hello": "who am I: what torchrun would tell each rank, read from the process group",
    "all_reduce": "every rank adds its rank number; all_reduce(SUM) gives each rank the total",
    "crash": "the last rank raises before a collective; its peers fail as knock-on",
    "hang": "rank 0 never joins the all_reduce its peers wait in",
    # 01 processes, ranks, stores
    "subgroups": "even and odd ranks in groups of their own (dist.new_group), each summing",
    "backends": "which backends this torch has (gloo, NCCL, MPI, UCC, XCCL), each really tried",
    "barrier_timeline": "ranks work for different times, then meet in dist.barrier()",
    "print_freely": "plain print on every rank: the ranks' lines interleave as they come",
    "dprint": "printing in rank order: rank 0's lines, then rank 1's, and so on",
    # 02 point to point
    "send_recv": "rank 0 sends to every other rank with isend, then waits on the requests",
    "recv_any": "rank 0 receives from any source, in whatever order the messages come",
    "ring": "a token goes around the ring, each rank adding its rank number",
    "deadlock": "the classic deadlock: every rank sends right, then receives from its left",
    "exchange": "the deadlock fixed: post the send and the recv, then wait on both",
    "ping_pong": "ranks 0 and 1 bounce tensors of growing size: round-trip times",
    # 03 collectives
    "collectives": "every collective once, in one run",
    "broadcast": "broadcast: rank 0's tensor copied to every rank",
    "reduce": "reduce: only rank 0's result is defined (gloo uses the others' as scratch)",
    "gather": "gather: rank 0 collects every rank's tensor",
    "all_gather": "all_gather: every rank ends with every rank's tensor, in rank order",
    "scatter": "scatter: rank 0 splits its tensor into equal parts, one per rank",
    "reduce_scatter": "reduce_scatter: rank i ends with part i summed over all ranks",
    "all_to_all": "all_to_all: part j of rank i goes to rank j, a transpose of the ranks' parts",
    "reduce_ops": "all_reduce with every ReduceOp on float32 and int64: the result or the error",
    "objects": "object collectives: any picklable object, of a different size on each rank",
    "barrier": "rank r arrives r steps late; nobody leaves the barrier before the last one",
    # 04 all-reduce from scratch
    "ring_trace": "a ring all-reduce step by step: rank r holds 10**r, so digits show who added",
    "allreduce_check": "every from-scratch all-reduce against dist.all_reduce on the same data",
    "allreduce_sweep": "times every from-scratch all-reduce at every message size (10-20 s)",
    # 05 DDP basics
    "ddp_basic": "the DDP tutorial's demo_basic: one SGD step of ToyModel on random data",
    "ddp_anatomy": "one DDP step recorded stage by stage, from a different model on each rank",
    "ddp_buffers": "BatchNorm's running mean as forward sees it: DDP broadcasts rank 0's buffers",
    "ddp_straggler": "the last rank never reaches DDP's gradient sync; the others wait for it",
    "ddp_model_parallel": "the DDP tutorial's demo_model_parallel: a replica in two halves",
    "ddp_seeds": "seeding policies: is the model the same on every rank, and the dropout not?",
    "sampler": "the indices DistributedSampler gives each rank, epoch by epoch",
    "eval_padding": "accuracy with DistributedSampler's padding against an exact sharded count",
    # 06 training a CNN
    "train_cnn": "trains the course's CNN on the digits: 10 epochs, about 10 s on 2 ranks",
    "step_throughput": "seconds per DDP step with and without gradient sync; the job's samples/s",
    # 07 inside DDP
    "buckets": "DDP's gradient buckets in iterations 0 and 1 (rank 0 prints them)",
    "overlap": "each rank's step time, and how much communication DDP hides behind backward",
    "comm_hooks": "DDP communication hooks: bytes all-reduced per step, and the final loss",
    "no_sync": "gradient accumulation: all-reduces per optimizer step with and without no_sync",
    "unused_params": "a head without gradients: DDP's error, find_unused_parameters, static_graph",
    "bucket_views": "where the gradients live, without and with gradient_as_bucket_view",
    # 08 when it breaks
    "uneven_hang": "uneven inputs: rank 0 has one batch more and waits in DDP (use -n 3)",
    "monitored_barrier": "monitored_barrier names the ranks that never arrive (use -n 4)",
}


def describe(names, hangs: dict[str, float]) -> str:
    """The demo list of ``run --help``: a name and its line, one per demo; a ``*`` marks
    the demos that hang on purpose, and a note under the list says when they are stopped."""
    width = max(map(len, names))
    lines = [f"  {name:<{width}}  {DEMO_LINES[name]}{' *' if name in hangs else ''}"
             for name in sorted(names)]
    stops = sorted({f"{seconds:g} s" for seconds in hangs.values()})
    lines += ["", f"  * hangs on purpose: stopped after {' or '.join(stops)} (--timeout "
                  "changes it), with every rank's stack"]
    return "\n".join(lines)
