"""00b cell 20-21: after monitored_barrier timed out on rank 0, does "the next collective fail
at once" on every rank, or only on rank 0 while the others wait in it?
Run from the root of a checkout of 46d1faf: flock /tmp/ddp-lab-cpu.lock .venv/bin/python docs/reviews/repro/00b_after_monitored_barrier.py
"""
import time

import ddp_lab

with ddp_lab.Ranks(4, timeout=20, echo=False) as ranks:
    try:
        ranks.exec("from datetime import timedelta\n"
                   "if rank != 3:\n    dist.monitored_barrier(timeout=timedelta(seconds=2))\n")
    except ddp_lab.WorkerError as err:
        print("monitored_barrier:", err.session)
    start = time.monotonic()
    try:
        ranks.exec("dist.all_reduce(torch.ones(1))", timeout=8)
    except (ddp_lab.WorkerError, ddp_lab.WorkerTimeout) as err:
        took = time.monotonic() - start
        print(f"next all_reduce: {type(err).__name__} after {took:.1f} s, session={err.session}")
        print("\n".join(l for l in str(err).splitlines() if l.strip())[:2500])
