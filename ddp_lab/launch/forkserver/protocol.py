"""Messages between the launcher and its fork server, with file descriptors attached.

A SOCK_SEQPACKET Unix socket keeps message boundaries, so one ``sendmsg`` is one message
and the descriptors (a rank's output pipe, the run's lifeline) travel with it (SCM_RIGHTS).
That lets the launcher own the read ends of pipes whose write ends live in processes it did
not fork itself.
"""

from __future__ import annotations

import pickle
import select
import socket
import time

MAX_MESSAGE = 1 << 20
MAX_FDS = 8


def socket_pair() -> tuple[socket.socket, socket.socket]:
    """A connected pair; the second end is made inheritable for the fork server."""
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    theirs.set_inheritable(True)
    return ours, theirs


def send(sock: socket.socket, message: tuple, fds: list[int] = (),
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


def receive(sock: socket.socket) -> tuple[tuple | None, list[int]]:
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
