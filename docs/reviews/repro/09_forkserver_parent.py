"""Review of notebook 09, cells 16-20 (elastic_launch with start_method="forkserver").

1. launch_from_python runs a crash-then-restart entrypoint (as flaky_all_reduce does) and
   each worker reports its pid and its parent's pid: with the fork server, the workers of
   both attempts have the same parent (the one fork server, which imported torch once).
2. A TCPStore server created for "localhost:0" (the rendezvous endpoint the child uses):
   on which address does it listen?

    flock /tmp/ddp-lab-cpu.lock .venv/bin/python docs/reviews/repro/09_forkserver_parent.py
"""
import importlib
import os
import sys


def parent_of_worker():
    rank, restart = int(os.environ["RANK"]), int(os.environ["TORCHELASTIC_RESTART_COUNT"])
    if restart == 0 and rank == 1:
        raise RuntimeError("planned crash on attempt 0")
    return {"restart": restart, "pid": os.getpid(), "ppid": os.getppid(),
            "torch_imported_before_call": "torch" in sys.modules}


if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    me = importlib.import_module("09_forkserver_parent")  # picklable by reference
    from ddp_lab.course.ch09_torchrun import torchrun as torchrun_demo
    launched = torchrun_demo.launch_from_python(me.parent_of_worker, nproc=2, max_restarts=1)
    print("values:", launched.values)

    import datetime
    import psutil
    import torch.distributed as dist
    store = dist.TCPStore("localhost", 0, 1, is_master=True, timeout=datetime.timedelta(seconds=5))
    listening = sorted({f"{c.laddr.ip}:{c.laddr.port}" for c in psutil.Process().net_connections("tcp")
                        if c.status == psutil.CONN_LISTEN and c.laddr.port == store.port})
    print("TCPStore('localhost', 0, is_master=True) listens on:", listening)

# Output (2026-11-29, torch 2.13; the agent was pid 7694, the SIGTERMed attempt-0 worker 7745):
# values: {0: {'restart': 1, 'pid': 7789, 'ppid': 7734, 'torch_imported_before_call': True},
#          1: {'restart': 1, 'pid': 7790, 'ppid': 7734, 'torch_imported_before_call': True}}
# TCPStore('localhost', 0, is_master=True) listens on: [':::35307']
