"""The runs' rendezvous stores, hosted by a child of the fork server that never forks.

Why not in the fork server: a TCPStore serves from threads of its own, and fork copies only
the calling thread, so a lock another thread held at that instant stays held for ever in the
child (https://man7.org/linux/man-pages/man2/fork.2.html, "multithreaded process"). With the
stores in the fork server, one 4-rank run in a hundred hung at start, every rank waiting.
Why not in the kernel, as before: the store must listen inside the run's private network
(network/isolation.py), and its owner connects to it as a client too, which the kernel,
outside that network, cannot. So the fork server forks this host once, before any store
exists: it lives in the same private network, holds every run's store, and ends with the
fork server (end of file on its socket).
"""

from __future__ import annotations

import os
import pickle
import signal
import socket

from ddp_lab.launch.network.rendezvous import listening_store

MAX_REQUEST = 1 << 16
HOST_NAME = "ddp_lab-stores"  # the process's name (at most 15 bytes)
PR_SET_NAME = 15  # <linux/prctl.h>


class StoreHost:
    """The fork server's handle: ``open`` a run's store (its port), ``close`` it."""

    def __init__(self):
        self.sock, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self.pid = os.fork()
        if self.pid == 0:
            _become_host(theirs)
        theirs.close()

    def open(self, run_dir: str, host: str, world_size: int) -> int:
        """The run's store on ``host`` (loopback, or a shaped run's bridge): its port."""
        self.sock.sendall(pickle.dumps(("open", run_dir, host, world_size)))
        kind, answer = pickle.loads(self.sock.recv(MAX_REQUEST))
        if kind == "error":
            raise RuntimeError(answer)
        return answer

    def close(self, run_dir: str) -> None:
        """The run is over: its store stops (no answer is awaited)."""
        self.sock.sendall(pickle.dumps(("close", run_dir, None, 0)))


class Stores:
    """The fork server's side: a host forked on first use, and again when a run finds it
    dead (killed by hand, say). ``own`` is the reaper's set of the server's own helpers,
    which are no run's leftovers."""

    def __init__(self, own: set[int]):
        self.own = own
        self.host: StoreHost | None = None

    def open(self, run_dir: str, host: str, world_size: int) -> int:
        for last in (False, True):
            if self.host is None:
                self.host = StoreHost()
                self.own.add(self.host.pid)
            try:
                return self.host.open(run_dir, host, world_size)
            except (OSError, EOFError):
                self._drop()
                if last:
                    raise

    def close(self, run_dir: str) -> None:
        if self.host is not None:
            try:
                self.host.close(run_dir)
            except OSError:
                self._drop()

    def close_in_child(self) -> None:
        """In a freshly forked rank: the host's end of file must come from the server alone."""
        if self.host is not None:
            self.host.sock.close()

    def _drop(self) -> None:
        self.own.discard(self.host.pid)  # reaped, or put down as a leftover
        self.host.sock.close()
        self.host = None


def _become_host(sock: socket.socket) -> None:
    """In the child: keep nothing of the fork server's (its socket to the launcher above
    all: the launcher must see end of file when the server dies), serve, exit."""
    try:
        _name_this_process(HOST_NAME)
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        os.closerange(3, sock.fileno())
        os.closerange(sock.fileno() + 1, os.sysconf("SC_OPEN_MAX"))
        _serve(sock)
    finally:
        os._exit(0)


def _name_this_process(name: str) -> None:
    """What ``ps -o comm`` (and psutil's name()) show: a forked copy of the fork server
    would otherwise look just like it, or like a rank."""
    import ctypes
    ctypes.CDLL(None).prctl(PR_SET_NAME, name.encode()[:15], 0, 0, 0)


def _serve(sock: socket.socket) -> None:
    stores: dict[str, object] = {}
    while request := sock.recv(MAX_REQUEST):
        kind, run_dir, host, world_size = pickle.loads(request)
        if kind == "close":
            stores.pop(run_dir, None)  # its destructor stops its thread, closes its port
            continue
        try:
            stores[run_dir], port = listening_store(host, world_size)
            sock.sendall(pickle.dumps(("port", port)))
        except Exception as exc:  # noqa: BLE001 - every failure goes back as an answer
            sock.sendall(pickle.dumps(("error", f"{type(exc).__name__}: {exc}")))
