"""Inside each rank of ``ddp_lab.spawn``: pin the rendezvous to this run's store, then call
``fn(rank, *args)`` as ``torch.multiprocessing.spawn`` would.

Published examples hard-code ``MASTER_PORT='12355'``: two runs at once (two notebooks, a test
suite) would fight over that port, and the rank that hosts it would listen on every
interface. So in each rank ``env://`` and ``tcp://`` rendezvous join this run's own store,
which the launcher bound to 127.0.0.1 on a free port, whatever address and port the function
wrote (the kernel's side: ``ddp_lab/launch/mp_spawn.py``).
"""

from __future__ import annotations

import functools
import os
from datetime import timedelta

REDIRECTED_SCHEMES = ("env", "tcp")  # file:// needs no port, so it is used as written


def call_on_rank(fn, *args):
    """Runs inside each rank: pins the rendezvous to this run's store, then fn(rank, *args).

    Read before fn runs: the launcher's RANK, MASTER_ADDR and MASTER_PORT (fn may overwrite
    the last two in os.environ, as the examples do)."""
    env = os.environ
    pin_rendezvous(env["MASTER_ADDR"], int(env["MASTER_PORT"]))
    return fn(int(env["RANK"]), *args)


def pin_rendezvous(host: str, port: int) -> None:
    """Point ``env://`` and ``tcp://`` rendezvous of this process at the store on host:port.

    torch looks its handlers up by scheme at every ``init_process_group`` call
    (torch/distributed/rendezvous.py, ``_rendezvous_handlers``); the public
    ``register_rendezvous_handler`` refuses to replace one, hence the dict."""
    import importlib
    rendezvous = importlib.import_module("torch.distributed.rendezvous")
    handler = functools.partial(_store_rendezvous, host, port)
    for scheme in REDIRECTED_SCHEMES:
        rendezvous._rendezvous_handlers[scheme] = handler


def _store_rendezvous(host: str, port: int, url: str, timeout=timedelta(minutes=30),
                      **_kwargs):
    """torch's env:// handler with the address fixed: a client of the launcher's store.

    Rank and world size come as torch put them in the URL (from init_process_group's
    arguments, else RANK/WORLD_SIZE), so a wrong world_size in fn still shows as it would
    under mp.spawn: a rendezvous that waits for ranks that never come."""
    from urllib.parse import parse_qsl, urlparse

    from torch.distributed import TCPStore
    query = dict(parse_qsl(urlparse(url).query))
    rank = int(query.get("rank", os.environ["RANK"]))
    world_size = int(query.get("world_size", os.environ["WORLD_SIZE"]))
    store = TCPStore(host, port, world_size, is_master=False, timeout=timeout)
    yield store, rank, world_size
    raise RuntimeError("re-rendezvous is not supported: start the run again")
