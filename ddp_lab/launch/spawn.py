"""``spawn``: run a function written for ``torch.multiprocessing.spawn`` unchanged.

Published examples (the PyTorch DDP tutorial,
https://pytorch.org/tutorials/intermediate/ddp_tutorial.html, and pytorch/examples'
distributed/ddp-tutorial-series/multigpu.py) are written as ``fn(rank, world_size)`` that
sets ``MASTER_ADDR``/``MASTER_PORT`` and calls ``init_process_group`` itself. ``ddp_lab.run``
initializes the group before calling fn, so such a function fails there twice over. This
runs it as ``mp.spawn`` would, on the same ranks, output, errors and cleanup as ``run``.

The one thing changed behind the function's back is where its rendezvous goes. The examples
hard-code ``MASTER_PORT='12355'``: two runs at once (two notebooks, a test suite) would
fight over that port, and the rank that hosts it would listen on every interface. So in
each rank ``env://`` and ``tcp://`` rendezvous join this run's own store, which the launcher
bound to 127.0.0.1 on a free port, whatever address and port the function wrote.
"""

from __future__ import annotations

import functools
import os
from datetime import timedelta

from ddp_lab.launch import checks
from ddp_lab.launch.config import LaunchConfig

START_METHODS = ("spawn", "fork", "forkserver")
SPAWN_CALL_ADVICE = (
    "ddp_lab.spawn calls fn(rank, *args) on every rank, as torch.multiprocessing.spawn "
    "does: fn's first parameter is the rank, args= holds the rest (e.g. args=(world_size,)). "
    "For a function that expects the process group ready, use ddp_lab.run(fn, world_size, "
    "args=...).")
REDIRECTED_SCHEMES = ("env", "tcp")  # file:// needs no port, so it is used as written


def spawn(fn, args=(), nprocs: int = 1, join: bool = True, daemon: bool = False,
          start_method: str = "spawn", *, timeout: float = 60.0, env=None,
          echo: bool = True):
    """Call ``fn(rank, *args)`` on ``nprocs`` ranks; fn initializes its own process group.

    ``torch.multiprocessing.spawn``'s signature and defaults, positional and keyword (a
    test holds the two side by side), so a script written for ``mp.spawn`` runs with its
    import line changed; ddp_lab's own options are keyword-only. Returns a RunResult
    (``.values``: fn's return value per rank) where ``mp.spawn`` returns None. With
    ``join=False`` it returns at once a SpawnContext whose ``join()`` waits, as
    ``mp.spawn``'s ProcessContext does. ``daemon`` and ``start_method`` are checked and
    otherwise ignored: ranks are always fresh processes forked from ddp_lab's fork server,
    and never outlive the launcher.
    """
    __tracebackhide__ = True
    from ddp_lab.launch.api import _launch, pickle_payload
    checks.check_callable(fn)
    _check_mp_options(join, daemon, start_method)
    config = LaunchConfig(world_size=checks.check_world_size(nprocs), backend="auto",
                          timeout=checks.check_timeout(timeout), env=checks.check_env(env),
                          echo=bool(echo), init_group=False)
    args, _ = checks.check_call_args(args, None)
    payload = pickle_payload(functools.partial(call_on_rank, fn), args, {})
    checks.check_signature(fn, (0, *args), {}, SPAWN_CALL_ADVICE,
                           call=f"fn(rank, *args), args={args!r}")
    if not join:
        from ddp_lab.launch.spawn_context import SpawnContext
        return SpawnContext(functools.partial(_launch, config, payload))
    return _launch(config, payload)


def _check_mp_options(join, daemon, start_method) -> None:
    """mp.spawn's own options: a wrong type here is a typo or a shifted positional
    argument (ddp_lab.spawn's 4th was timeout once), so it fails before anything starts."""
    for name, value in (("join", join), ("daemon", daemon)):
        if not isinstance(value, bool):
            raise TypeError(f"{name} must be True or False (as in torch.multiprocessing."
                            f"spawn), got {value!r}; ddp_lab's timeout is keyword-only: "
                            "spawn(fn, args, nprocs, timeout=...)")
    if start_method not in START_METHODS:
        raise ValueError(f"unknown start_method {start_method!r}: torch.multiprocessing "
                         f"knows {', '.join(START_METHODS)} (ddp_lab ignores it: ranks are "
                         "always fresh processes from its fork server)")


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
