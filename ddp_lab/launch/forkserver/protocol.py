"""The fork server's protocol: typed messages between the launcher and its fork server, and
how they travel, file descriptors attached.

Each message is a frozen dataclass; each side handles what it receives in one place
(``Server._on_message`` in server.py, ``Session._on_event`` in session.py; the launcher's
reader thread, client.py, only routes a run's messages to that run by their ``run_dir``).

A SOCK_SEQPACKET Unix socket keeps message boundaries, so one ``sendmsg`` is one message
and the descriptors (a rank's output pipe, the run's lifeline) travel with it (SCM_RIGHTS).
That lets the launcher own the read ends of pipes whose write ends live in processes it did
not fork itself. When the launcher goes away (end of file on the socket) the server kills
every rank and leftover and exits.
"""

from __future__ import annotations

import pickle
import select
import socket
import time
from dataclasses import dataclass

MAX_MESSAGE = 1 << 20
MAX_FDS = 8


# -- launcher -> server -----------------------------------------------------------------------
@dataclass(frozen=True)
class SpawnRank:
    """Fork one rank. Descriptors: [output_pipe_w, lifeline_r] (+ [calls_r, replies_w] for a
    live rank, live/). Answered by ``Spawned``, then ``Exited`` when it ends."""

    spec: object  # config.RankSpec


@dataclass(frozen=True)
class SignalRank:
    """Signal a rank (SIGKILL: and everything below it; SIGUSR1: dump your stack)."""

    pid: int
    signum: int


@dataclass(frozen=True)
class EndRun:
    """The run is over: put its leftovers down (reaper.py); answered by ``RunEnded``."""

    run_dir: str


@dataclass(frozen=True)
class NetUp:
    """Host the run's store, after building what its placement plans (network/placement.py:
    a shaped run's links, network/switch.py, which only the server of shaped runs can).
    Answered by ``NetReady``."""

    run_dir: str
    world_size: int
    plan: object  # placement.link_plan(): a network.setting.LinkPlan; None: store on loopback


# -- server -> launcher -----------------------------------------------------------------------
@dataclass(frozen=True)
class Ready:
    """torch and what runs use later are imported (PRELOAD, WARM): runs may start. Sent
    once, when the server has started."""


@dataclass(frozen=True)
class Spawned:
    run_dir: str
    rank: int
    pid: int


@dataclass(frozen=True)
class Exited:
    run_dir: str
    pid: int
    exitcode: int  # < 0: killed by that signal


@dataclass(frozen=True)
class RunEnded:
    """No rank and no leftover of that run is left."""

    run_dir: str


@dataclass(frozen=True)
class NetReady:
    run_dir: str
    address: tuple | None  # (host, port) of the run's store (loopback, or the bridge)
    error: str | None
    store_host: int | None = None  # its pid: a process the server keeps (store_host.py)


# -- the launcher's reader thread -> a run ----------------------------------------------------
@dataclass(frozen=True)
class ServerDied:
    """The server is gone: no more answers will come."""


def socket_pair() -> tuple[socket.socket, socket.socket]:
    """A connected pair; the second end is made inheritable for the fork server."""
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    theirs.set_inheritable(True)
    return ours, theirs


def send(sock: socket.socket, message, fds: list[int] = (),
         timeout: float | None = None) -> None:
    """Send one message; with ``timeout``, raise TimeoutError if the peer has not made room
    for it by then. A peer that stopped reading (SIGSTOP, wedged) fills the socket's buffer
    after a few hundred messages, and a plain send then blocks forever.
    https://man7.org/linux/man-pages/man7/unix.7.html"""
    data = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
    if len(data) > MAX_MESSAGE:
        raise ValueError(f"message of {len(data)} bytes is larger than {MAX_MESSAGE}")
    if timeout is not None:
        _wait_writable(sock, time.monotonic() + timeout)
    socket.send_fds(sock, [data], list(fds))


def _wait_writable(sock: socket.socket, deadline: float) -> None:
    """Poll first: once poll says writable, at least 3/4 of the send buffer is free, so the
    send cannot block. (MSG_DONTWAIT alone is not enough: a send with SCM_RIGHTS attached
    was seen to block on Linux 6.18 with the peer's queue full.)"""
    poller = select.poll()
    poller.register(sock, select.POLLOUT)
    while not poller.poll(max(0.0, min(deadline - time.monotonic(), 0.1)) * 1000):
        if time.monotonic() >= deadline:
            raise TimeoutError("the peer has not read its messages")


def receive(sock: socket.socket) -> tuple[object | None, list[int]]:
    """One message and its descriptors; ``(None, [])`` once the peer has gone."""
    try:
        data, fds, _flags, _addr = socket.recv_fds(sock, MAX_MESSAGE, MAX_FDS)
    except ConnectionResetError:  # the peer died (SEQPACKET reports it so, not as EOF)
        return None, []
    if not data:
        for fd in fds:
            _close_quietly(fd)
        return None, []
    return pickle.loads(data), fds


def _close_quietly(fd: int) -> None:
    import os
    try:
        os.close(fd)
    except OSError:
        pass
