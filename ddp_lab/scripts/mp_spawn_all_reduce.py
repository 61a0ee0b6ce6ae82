"""The same all_reduce round trip launched the classic way, with torch.multiprocessing.spawn
(the peer ``ddp-lab bench launch`` compares against). Usage: python mp_spawn_all_reduce.py N
"""

import os
import socket
import sys

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def worker(rank: int, world_size: int, port: int) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world_size)
    t = torch.tensor([float(rank)])
    dist.all_reduce(t)
    dist.destroy_process_group()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


if __name__ == "__main__":
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 4
    mp.spawn(worker, args=(n, free_port()), nprocs=n)
