"""Notebook 01, sections 2 and 3: how ranks find each other, and the store they meet in.

``init_process_group`` needs a *rendezvous*: every rank publishes its address in a small
key-value store and reads the others'. The ``init_method`` names that store: env:// and
tcp:// a TCPStore at host:port, file:// a FileStore on a file every rank sees. Each of the
three methods runs here in fresh ranks (this file run as a script, as torchrun would), and
the stores are then used directly (``register``). Everything listens on 127.0.0.1 only,
inside the run's private network (launch/network/isolation.py): no other user reaches it.
"""

from __future__ import annotations

import os
import socket
import sys
from dataclasses import dataclass, replace
from datetime import timedelta

from ddp_lab.course.ports import free_loopback_port, lost_port_race

STORE_TIMEOUT = timedelta(seconds=30)


@dataclass(frozen=True)
class Rendezvous:
    """Where the ranks meet. env://: a TCPStore at MASTER_ADDR:MASTER_PORT, rank and size
    from RANK and WORLD_SIZE (under torchrun and ddp_lab the launcher hosts that store);
    tcp://: a TCPStore that rank 0 serves at 127.0.0.1:port; file://: a FileStore on
    ``path``, a file every rank can see."""

    kind: str       # "env", "tcp" or "file"
    port: int = 0   # tcp: the loopback port rank 0 serves the store on
    path: str = ""  # file: a fresh file, e.g. in a private folder (a shared FS across machines)

    @property
    def url(self) -> str:
        return {"env": "env://", "tcp": f"tcp://127.0.0.1:{self.port}",
                "file": f"file://{self.path}"}[self.kind]

    def to_args(self) -> list[str]:
        return [self.kind, str(self.port), self.path]

    @classmethod
    def from_args(cls, args) -> "Rendezvous":
        kind, port, path = (list(args) + ["0", ""])[:3]
        return cls(kind, int(port), path)


def serve_store(port: int, world_size: int):
    """Rank 0's TCPStore server on 127.0.0.1 only. A plain ``TCPStore(is_master=True)``
    listens on every interface (it has no bind address option), so we bind the socket
    ourselves and hand it over with ``master_listen_fd``, as ddp_lab's launcher does.
    SO_REUSEADDR: a port that served a store a moment ago still has connections in
    TIME_WAIT (about a minute), which would make this bind fail; it still refuses a port
    that someone else is listening on."""
    from torch.distributed import TCPStore
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", port))
        listener.listen(128)
        server = TCPStore("127.0.0.1", port, world_size, is_master=True, timeout=STORE_TIMEOUT,
                          wait_for_workers=False, master_listen_fd=listener.fileno())
    except BaseException:
        listener.close()
        raise
    listener.detach()  # the store owns the descriptor now
    return server


def open_store(rdv: Rendezvous, rank: int, world_size: int):
    """This rank's handle on the store of a tcp or file ``rdv``, and the server if this
    rank serves it (rank 0, tcp), else None."""
    from torch.distributed import FileStore, TCPStore
    if rdv.kind == "file":
        return FileStore(rdv.path, world_size), None
    server = serve_store(rdv.port, world_size) if rank == 0 else None
    client = TCPStore("127.0.0.1", rdv.port, world_size, is_master=False, timeout=STORE_TIMEOUT)
    return client, server


def join_group(rdv: Rendezvous) -> dict:
    """Create this process's group through ``rdv`` and prove it works with an all_reduce
    of rank + 1 (every rank gets N(N+1)/2). Runs in a fresh process (see ``main``).

    Why not inside a ``ddp_lab.run`` worker? There the default group exists already, and
    ``dist.new_group`` cannot help (a subgroup reuses the default group's store). Destroying
    it and initializing again in the same process is allowed, but under load (4 launches
    at once on 2 cores) 7 of 240 such runs failed with "Gloo connectFullMesh failed ...
    Connection closed by peer", and 0 of 240 in fresh processes. Real jobs initialize once.
    """
    import torch
    import torch.distributed as dist
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    server = serve_store(rdv.port, world) if rank == 0 and rdv.kind == "tcp" else None
    # The server exists already, so every rank, rank 0 included, must connect as a client.
    os.environ["TORCHELASTIC_USE_AGENT_STORE"] = "True"
    if rdv.kind == "env":  # address, rank and world size all come from the environment
        dist.init_process_group("gloo", init_method="env://", timeout=STORE_TIMEOUT)
    else:
        dist.init_process_group("gloo", init_method=rdv.url, rank=rank, world_size=world,
                                timeout=STORE_TIMEOUT)
    t = torch.tensor([rank + 1.0])
    dist.all_reduce(t)
    info = {"url": rdv.url, "rank": dist.get_rank(), "world_size": dist.get_world_size(),
            "sum": t.item(), "listening": listening_hosts()}
    print(f"joined through {rdv.url}: rank {info['rank']} of {info['world_size']}")
    dist.barrier()  # nobody still needs rank 0's store after this
    dist.destroy_process_group()
    del server
    return info


def listening_hosts() -> list[str]:
    """The addresses this process listens on (the store server, gloo's own sockets)."""
    import psutil
    return sorted({c.laddr.ip for c in psutil.Process().net_connections("tcp")
                   if c.status == "LISTEN"})


def join_in_fresh_ranks(rdv: Rendezvous, world_size: int = 3, echo: bool = True):
    """Start ``world_size`` fresh ranks that run this file, stores.py, as a script (as
    torchrun would start them) to join a group through ``rdv``; ``.values`` holds
    join_group's answers."""
    import ddp_lab
    return retry_port_race(rdv, lambda r: ddp_lab.run_script(
        __file__, world_size=world_size, script_args=r.to_args(), timeout=60, echo=echo))


def retry_port_race(rdv: Rendezvous, start, attempts: int = 3):
    """``start(rdv)``; if rank 0 lost the port race of ``free_loopback_port`` ("Address
    already in use"), again with a new port: what you would do by hand, done for you."""
    import ddp_lab
    for attempt in range(1, attempts + 1):
        try:
            return start(rdv)
        except ddp_lab.WorkerError as err:
            lost_race = rdv.kind == "tcp" and lost_port_race(err.traceback)
            if not lost_race or attempt == attempts:
                raise
            rdv = replace(rdv, port=free_loopback_port())


def register(rdv: Rendezvous) -> dict:
    """A tiny rendezvous by hand: each rank draws a ticket with ``add`` (atomic, so tickets
    are 1..N in arrival order), tries to become leader with ``compare_set`` (only the first
    try succeeds), then registers host:pid under its own key; all wait for everybody."""
    import torch.distributed as dist
    rank, world = dist.get_rank(), dist.get_world_size()
    store, server = open_store(rdv, rank, world)
    ticket = store.add("arrived", 1)
    leader = int(store.compare_set("leader", "", str(rank)))
    # Registered last: once every worker key exists, every rank's add is done too.
    store.set(f"worker/{rank}", f"{socket.gethostname()}:{os.getpid()}")
    store.wait([f"worker/{r}" for r in range(world)])
    info = {"rank": rank, "ticket": ticket, "arrived": store.add("arrived", 0),
            "leader": leader, "roster": [store.get(f"worker/{r}").decode() for r in range(world)]}
    store.set(f"done/{rank}", "1")
    if server is not None:  # the server must outlive every client's last request
        store.wait([f"done/{r}" for r in range(world)])
    return info


def register_in_ranks(rdv: Rendezvous, world_size: int = 4, echo: bool = True):
    """``register`` on ``world_size`` ranks of a ddp_lab run."""
    import ddp_lab
    return retry_port_race(rdv, lambda r: ddp_lab.run(
        register, world_size=world_size, args=(r,), timeout=60, echo=echo))


COMPARE_SET_CASES = (  # (key already stored, expected, desired)
    (None, "", "mine"), (None, "x", "mine"), ("x", "x", "mine"), ("x", "z", "mine"))


def compare_set_cases() -> list[dict]:
    """What ``compare_set(key, expected, desired)`` returns and leaves stored, case by case,
    on a fresh in-process ``HashStore`` (TCPStore and FileStore answer the same). Its
    docstring gives the rule for storing, not the return value: an absent key with a
    non-empty ``expected`` stores nothing and returns ``expected``."""
    import torch.distributed as dist
    rows = []
    for before, expected, desired in COMPARE_SET_CASES:
        store = dist.HashStore()
        if before is not None:
            store.set("key", before)
        returned = store.compare_set("key", expected, desired).decode()
        stored = store.get("key").decode() if store.check(["key"]) else None
        rows.append({"before": before, "expected": expected, "desired": desired,
                     "returned": returned, "stored": stored})
    return rows


def main(argv=None) -> None:
    """``python stores.py KIND [PORT [PATH]]`` on every rank (torchrun, run_script)."""
    from ddp_lab import report
    report(join_group(Rendezvous.from_args(sys.argv[1:] if argv is None else argv)))


if __name__ == "__main__":
    main()
