"""Worker functions the tests run on several ranks (importable, so sent by reference)."""

from __future__ import annotations

import os
import time
from pathlib import Path

import torch
import torch.distributed as dist


def rank_and_env() -> dict:
    keys = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
    return {"rank": dist.get_rank(), "world": dist.get_world_size(),
            "env": {k: os.environ[k] for k in keys}, "threads": torch.get_num_threads()}


def all_reduce_tensor(x: torch.Tensor, scale: float = 1.0) -> torch.Tensor:
    t = x * (dist.get_rank() + 1) * scale
    dist.all_reduce(t)
    return t


def chatty(lines: int) -> int:
    for i in range(lines):
        print(f"rank={dist.get_rank()} line={i}", flush=(i % 7 == 0))
    return lines


def flood(lines: int, fail: bool = False) -> int:
    """Rank 0 prints ``lines`` numbered lines of 100 bytes each (newline included), in
    blocks, as a ``print`` left in a loop would; the others print one line. ``fail``: rank 0
    raises once it is done."""
    import sys
    if dist.get_rank() != 0:
        print("a quiet rank")
        return 1
    for start in range(0, lines, 10_000):
        block = range(start, min(lines, start + 10_000))
        sys.stdout.write("".join(f"{i:09d} {'x' * 89}\n" for i in block))
    sys.stdout.flush()
    if fail:
        raise ValueError("failed after the flood")
    return lines


def no_newline(size: int) -> None:
    """``size`` bytes of ``a`` without a newline, then a line of its own."""
    import sys
    for _ in range(size // 65536):
        sys.stdout.write("a" * 65536)
    sys.stdout.write("a" * (size % 65536) + "\n" + "end\n")
    sys.stdout.flush()


def listening_addresses() -> list[str]:
    import psutil
    dist.barrier()
    addresses = [c.laddr.ip for c in psutil.Process().net_connections("inet")
                 if c.status == "LISTEN"]
    dist.barrier()
    return addresses


def write_pid_and_sleep(folder: str, seconds: float = 3600.0) -> None:
    Path(folder, f"rank{dist.get_rank()}.pid").write_text(str(os.getpid()))
    time.sleep(seconds)


def spawn_child_and_sleep(folder: str) -> None:
    """A rank with a child of its own (like a DataLoader worker) must not leave it behind."""
    import subprocess
    import sys
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(3600)"])
    Path(folder, f"child{dist.get_rank()}.pid").write_text(str(child.pid))
    write_pid_and_sleep(folder)


def raise_on(rank: int) -> None:
    if dist.get_rank() == rank:
        raise KeyError("no such batch")
    dist.all_reduce(torch.ones(1))


def segfault_on(rank: int) -> None:
    import signal
    if dist.get_rank() == rank:
        os.kill(os.getpid(), signal.SIGSEGV)
    dist.barrier()


def exit_early_on(rank: int) -> None:
    if dist.get_rank() != rank:
        dist.all_reduce(torch.ones(1))


def stuck_in_all_reduce_unless_rank0() -> None:
    if dist.get_rank() == 0:
        time.sleep(3600)
    dist.all_reduce(torch.ones(1))
