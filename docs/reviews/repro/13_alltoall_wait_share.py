"""Notebook 13 review, cells 20-22: how much of the "all-to-alls" time of link.step_shares is
waiting for the other ranks. The same steps (loopback, 4 ranks, link.WIDE), timed twice: as
the notebook times them (routing.comm_timers), and with a dist.barrier() before every timed
all-to-all whose time is counted apart (the wait), so the timer sees only the exchange.
Run: PYTHONPATH=<tree> python docs/reviews/repro/13_alltoall_wait_share.py"""
import statistics
import time
from contextlib import ExitStack
from unittest import mock

import torch.distributed as dist

import ddp_lab
from ddp_lab.course.ch13_experts import link, routing


def barrier_first(box, waits):
    stack = ExitStack()
    for name in ("dispatch", "all_to_all"):
        fn = getattr(routing.moe_module, name)

        def call(*args, fn=fn, **kwargs):
            t0 = time.perf_counter()
            dist.barrier(group=kwargs.get("group"))
            t1 = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                waits[0] += t1 - t0
                box[0] += time.perf_counter() - t1
        stack.enter_context(mock.patch.object(routing.moe_module, name, call))
    return stack


def measure():
    plain = link.step_shares(steps=4)["steps"]
    waits_all = []

    def timers(box):
        waits = [0.0]
        waits_all.append(waits)
        return barrier_first(box, waits)
    with mock.patch.object(link, "comm_timers", timers):
        fenced = link.step_shares(steps=4)["steps"]
    waits = [w[0] for w in waits_all[1:]]
    med = lambda xs: statistics.median(xs) * 1e3
    return (f"as the notebook times it: step {med([s['step'] for s in plain]):.0f} ms, "
            f"all-to-alls {med([s['comm'] for s in plain]):.0f} ms | with a barrier first: "
            f"waiting {med(waits):.0f} ms, exchanges {med([s['comm'] for s in fenced]):.0f} ms")


if __name__ == "__main__":
    for rank, line in enumerate(ddp_lab.run(measure, world_size=4, echo=False, timeout=120).values):
        print(f"rank {rank}: {line}")
