"""A free loopback port for demos that start their own rendezvous (stores, torchrun agents),
and how to tell that a run lost the race for one."""

from __future__ import annotations

import socket
import sys


def free_loopback_port() -> int:
    """A port that was free on 127.0.0.1 a moment ago (the kernel picks it, 0 = any).

    There is a small race: we must close the socket to hand the number to rank 0, and in
    between another program may take the port; rank 0's bind then fails with "Address
    already in use" and a rerun picks a new one (torchrun's own ``get_free_port`` has the
    same race and says so). ddp_lab's launcher avoids it by keeping its socket open and
    handing it to its store. The demos that use this run in a private network
    (launch/network/isolation.py), where no other user's program can take the port: only where the
    system refuses one (``DDP_LAB_ISOLATION``'s fallback) could another user's.
    """
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def lost_port_race(text: str) -> bool:
    """Whether ``text`` (a traceback, a log) says a store found its port taken when it came
    to bind it: the race above, also run by torchrun's agent when the rendezvous store is
    not shared (``get_free_port``). Python's ``bind`` says "Address already in use", c10d's
    TCPStore "EADDRINUSE"."""
    return "Address already in use" in text or "EADDRINUSE" in text


def say_lost_port_race(next_step: str) -> None:
    """Tell the learner, on stderr, why a demo runs again: a lost port race, not a bug."""
    print(f"a worker found its port taken (EADDRINUSE, torchrun's port race): {next_step}",
          file=sys.stderr)
