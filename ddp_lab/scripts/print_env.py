"""What a launcher tells each worker, then one all_reduce to prove the workers found
each other: the ``elastic_ddp.py`` smoke test of PyTorch's DDP tutorial, on any launcher.

    torchrun --standalone --nproc-per-node=2 print_env.py
    torchrun --nnodes=2 --nproc-per-node=2 --rdzv-backend=c10d \\
        --rdzv-endpoint=HOST:29400 --rdzv-id=1 print_env.py        # on every node
    python -m torch.distributed.launch --nproc-per-node=2 print_env.py   # the legacy way

Each worker prints its torchrun variables in one line, and ``ddp_lab.report``s them (with
its hostname, pid, argv and the all_reduce result) when ddp_lab collects results.
"""

from __future__ import annotations

import argparse
import os
import socket
import sys
from datetime import timedelta

import torch
import torch.distributed as dist

import ddp_lab

TORCHRUN_VARS = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK",
                 "GROUP_WORLD_SIZE", "ROLE_NAME", "ROLE_RANK", "ROLE_WORLD_SIZE", "MASTER_ADDR",
                 "MASTER_PORT", "TORCHELASTIC_RESTART_COUNT", "TORCHELASTIC_MAX_RESTARTS",
                 "TORCHELASTIC_RUN_ID", "TORCHELASTIC_USE_AGENT_STORE", "OMP_NUM_THREADS")
SHOWN = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "GROUP_RANK", "MASTER_ADDR",
         "TORCHELASTIC_RESTART_COUNT")


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    # torch.distributed.launch (without --use-env) passes --local-rank=N; torch < 2.0
    # passed --local_rank=N: accept both spellings, as torch's docs advise
    parser.add_argument("--local-rank", "--local_rank", type=int, default=None)
    parser.add_argument("--timeout", type=float, default=60.0,
                        help="seconds init_process_group waits for the other workers")
    return parser.parse_args(argv)


def main(argv=None) -> None:
    args = parse_args(argv)
    env = {name: os.environ.get(name) for name in TORCHRUN_VARS}
    print(" ".join(f"{name}={env[name]}" for name in SHOWN), flush=True)
    dist.init_process_group("gloo", init_method="env://",
                            timeout=timedelta(seconds=args.timeout))
    total = torch.tensor([float(dist.get_rank())])
    dist.all_reduce(total)
    addresses = own_addresses()
    print(f"rank {dist.get_rank()} on {socket.gethostname()} {addresses}: all_reduce sum of "
          f"ranks = {total.item():g}", flush=True)
    ddp_lab.report({"env": env, "local_rank_arg": args.local_rank, "argv": sys.argv[1:],
                    "sum": total.item(), "pid": os.getpid(), "addresses": addresses,
                    "hostname": socket.gethostname(),
                    "gloo_ifname": os.environ.get("GLOO_SOCKET_IFNAME")})
    dist.destroy_process_group()


def own_addresses() -> list[str]:
    """This machine's IPv4 addresses other than loopback: which "host" a worker is on."""
    import psutil
    return sorted(a.address for addrs in psutil.net_if_addrs().values() for a in addrs
                  if a.family == socket.AF_INET and not a.address.startswith("127."))


if __name__ == "__main__":
    main()
