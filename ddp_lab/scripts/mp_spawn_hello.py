"""The ``if __name__ == "__main__":`` pattern that ``torch.multiprocessing.spawn`` needs.

    python mp_spawn_hello.py --nprocs 2               # each worker all-reduces and prints
    python mp_spawn_hello.py --nprocs 2 --hold 60     # workers then wait (orphan demo)

``mp.spawn`` starts each worker as a fresh interpreter that imports this file as its main
module (under the name ``__mp_main__``) to find ``worker``. Without the guard, that import
would run the launching code again in every child, which Python refuses with "An attempt
has been made to start a new process before the current process has finished its
bootstrapping phase" (https://docs.python.org/3/library/multiprocessing.html, "Safe
importing of main module").
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import sys
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def worker(rank: int, world_size: int, port: int, hold_s: float) -> None:
    if hold_s:  # the orphan demo kills the parent as soon as every worker has printed
        # torch's spawn asks Linux for a SIGINT to each worker when its parent dies
        # (PR_SET_PDEATHSIG, torch/multiprocessing/spawn.py _wrap); a worker stuck in a
        # collective's C++ wait does not turn it into a KeyboardInterrupt until that wait
        # ends (at the group's timeout). Ignoring SIGINT makes this worker deaf meanwhile,
        # so it is orphaned like that one. Ignored, not
        # blocked: a mask holds only for this thread, and the kernel hands a process's
        # signal to any thread that does not block it (torch's own threads included).
        signal.signal(signal.SIGINT, signal.SIG_IGN)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world_size)
    total = torch.tensor([float(rank + 1)])
    dist.all_reduce(total)
    # one write of the whole line: print() writes text and newline apart, so two workers'
    # lines on a shared pipe could run together
    sys.stdout.write(f"worker {rank} (pid {os.getpid()}, parent {os.getppid()}): all_reduce "
                     f"sum {total.item():g}\n")
    sys.stdout.flush()
    dist.destroy_process_group()
    time.sleep(hold_s)  # the orphan demo: the parent dies meanwhile


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nprocs", type=int, default=2)
    parser.add_argument("--hold", type=float, default=0.0, help="seconds workers wait at the end")
    args = parser.parse_args()
    mp.spawn(worker, args=(args.nprocs, free_port(), args.hold), nprocs=args.nprocs)


if __name__ == "__main__":
    main()
