"""The run's rendezvous: a TCPStore server on a socket bound to 127.0.0.1 by us, hosted by
the fork server inside its private network (launch/network/isolation.py).

Binding it ourselves makes the port ours from the start (no race with another run) and
keeps it off the network; the private namespace keeps it from the machine's other users.
Ranks reach it as ``env://`` clients (TORCHELASTIC_USE_AGENT_STORE),
so worker scripts run unchanged under torchrun.
"""

from __future__ import annotations

import os
import socket


LOOPBACK = "127.0.0.1"


def loopback_store(world_size: int):
    """``(store, port)``: a TCPStore server listening on 127.0.0.1 only (never 0.0.0.0)."""
    return listening_store(LOOPBACK, world_size)


def listening_store(host: str, world_size: int):
    """``(store, port)``: a TCPStore server listening on ``host`` only (loopback, or a
    shaped run's bridge: switch.py).

    TCPStore takes ownership of the descriptor it is given (``master_listen_fd``) and closes
    it when it is destroyed, also when it is destroyed because an interrupt landed just
    after it was built. Whoever owns the descriptor closes it, exactly once: closing it
    again would fail with EBADF (hiding the KeyboardInterrupt), or, in a threaded kernel,
    close a file another thread has opened under the same number since."""
    from torch.distributed import TCPStore
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    store = identity = None
    try:
        listener.bind((host, 0))
        listener.listen(max(128, world_size))
        port = listener.getsockname()[1]
        identity = file_identity(listener.fileno())
        store = TCPStore(host, port, world_size, is_master=True,
                         wait_for_workers=False, master_listen_fd=listener.fileno())
        listener.detach()  # the store owns the descriptor now
        return store, port
    except BaseException:
        taken = identity is not None and file_identity(listener.fileno()) != identity
        if store is not None or taken:
            listener.detach()  # the store owns it, or has closed it already
        listener.close()
        raise


def file_identity(fd: int) -> tuple[int, int] | None:
    """(device, inode) of what ``fd`` refers to now; None when it is not open."""
    try:
        stat = os.fstat(fd)
    except OSError:
        return None
    return stat.st_dev, stat.st_ino
