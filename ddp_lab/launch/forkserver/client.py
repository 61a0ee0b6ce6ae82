"""The launcher's side of the fork server: start it once per process, spawn ranks through it.

One server per launcher process is the point (torch is imported once, later launches are
near-instant), so it is kept in a process-wide holder. It is started lazily by the first run,
restarted if it died, and dies with this process: it watches its end of the socket, so even
a SIGKILL of the kernel makes it kill every rank and exit.
"""

from __future__ import annotations

import atexit
import os
import queue
import socket
import subprocess
import sys
import threading
import time

from ddp_lab.launch.config import package_pythonpath
from ddp_lab.launch.deadlines import CLOSE_WAIT_S, SEND_TIMEOUT_S, SPAWN_REPLY_TIMEOUT
from ddp_lab.launch.errors import ForkServerUnresponsive
from ddp_lab.launch.forkserver import process_tree, protocol
from ddp_lab.launch.forkserver.protocol import (EndRun, NetReady, NetUp, Ready, RunEnded,
                                                ServerDied, SignalRank, SpawnRank)
from ddp_lab.launch.interrupts import deferred
from ddp_lab.launch.network.placement import PRIVATE_SERVER, SHAPED_SERVER, ServerKind


class ForkServerDied(RuntimeError):
    """The fork server is gone (or stopped answering); the next run starts a new one."""


class ForkServer:
    """``prefix``: a command the server runs under (``unshare ... --``: its placement's
    ``ServerKind``, network/placement.py)."""

    def __init__(self, prefix: tuple[str, ...] = ()):
        self.prefix = prefix
        self.sock, theirs = protocol.socket_pair()
        self.process = subprocess.Popen(
            [*prefix, sys.executable, "-m", "ddp_lab.launch.forkserver.server",
             str(theirs.fileno())],
            pass_fds=[theirs.fileno()], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE if prefix else None, env=_server_env(),
            start_new_session=True)
        theirs.close()
        if prefix:
            threading.Thread(target=_pass_stderr, args=(self.process.stderr,),
                             name="ddp_lab-forkserver-stderr", daemon=True).start()
        self.pid_owner = os.getpid()
        self._send_lock = threading.Lock()
        self._routes: dict[str, queue.Queue] = {}  # run folder -> the run's queue of answers
        self._routes_lock = threading.Lock()
        self.alive = True
        self.store_host: int | None = None  # the pid of the server's store host, once known
        self.wedged = False  # it stopped reading our messages: only killing it helps
        self.ready = threading.Event()  # not importing; set on death too (nothing to wait for)
        threading.Thread(target=self._read_replies, name="ddp_lab-forkserver", daemon=True).start()

    def spawn(self, spec, fds: list[int], events: queue.Queue) -> None:
        """Ask for one rank; its ``Spawned`` and ``Exited`` go to ``events``."""
        self._route_run(spec.run_dir, events)
        self._send(SpawnRank(spec), fds)

    def signal(self, pid: int, signum: int) -> None:
        try:
            self._send(SignalRank(pid, signum))
        except ForkServerDied:
            pass  # dead: it killed every rank on its way out; wedged: the caller kills it

    def end_run(self, run_dir: str, events: queue.Queue) -> None:
        """Ask for ``RunEnded`` in ``events`` once the run's leftovers are gone."""
        self._route_run(run_dir, events)
        self._send(EndRun(run_dir))

    def net_up(self, run_dir: str, world_size: int, plan, events: queue.Queue) -> None:
        """Ask for the run's store (``plan``: what its placement builds first, None:
        nothing); ``NetReady`` goes to ``events``."""
        self._route_run(run_dir, events)
        self._send(NetUp(run_dir, world_size, plan))

    def forget_run(self, run_dir: str) -> None:
        """The run is over: answers that still come for it are dropped."""
        with self._routes_lock:
            self._routes.pop(run_dir, None)

    def _route_run(self, run_dir: str, events: queue.Queue) -> None:
        with self._routes_lock:
            self._routes[run_dir] = events

    def _send(self, message, fds: list[int] = ()) -> None:
        if self.wedged:
            raise ForkServerDied("the ddp_lab fork server stopped answering")
        if self.sock.fileno() < 0:  # closed by shutdown(): at exit, a live session's close
            self.alive = False       # may come after it (its ranks went with the server)
            raise ForkServerDied("the ddp_lab fork server was shut down")
        try:
            with self._send_lock:
                protocol.send(self.sock, message, fds, timeout=SEND_TIMEOUT_S)
        except TimeoutError as exc:
            self.alive, self.wedged = False, True
            raise ForkServerDied("the ddp_lab fork server stopped answering") from exc
        except OSError as exc:
            self.alive = False
            raise ForkServerDied(f"the ddp_lab fork server is gone ({exc})") from exc

    def _read_replies(self) -> None:
        while True:
            try:
                message, _fds = protocol.receive(self.sock)
            except OSError:
                message = None
            if message is None:
                return self._on_death()
            self._route(message)

    def wait_ready(self) -> None:
        """Wait while a new server imports torch and what runs use later (server.PRELOAD and
        WARM); once it has said "ready", at once.

        A run starts its deadline only after this, so a short ``timeout`` is not eaten by
        an import, which takes seconds, and many more on busy cores. A server that is
        stopped (SIGSTOP) or still not ready after SPAWN_REPLY_TIMEOUT is killed.
        """
        deadline = time.monotonic() + SPAWN_REPLY_TIMEOUT
        while not self.ready.wait(0.1):
            if process_tree.stopped(self.process.pid) or time.monotonic() > deadline:
                pid = self.process.pid
                self.kill()
                raise ForkServerUnresponsive(
                    f"the ddp_lab fork server (pid {pid}) stopped answering while it imported "
                    "torch (was it stopped with SIGSTOP, or is this machine far too busy?). "
                    "It was killed; run again and a new one is started.")
        if not self.alive:
            raise ForkServerDied(
                "the new ddp_lab fork server died while importing torch (`python -c \"import "
                "torch\"` says whether this environment can); run again to start a new one")

    def _route(self, message) -> None:
        """The server's own state (``Ready``) is kept here; every other answer belongs to a
        run and goes to that run's queue as it is (session.py handles it)."""
        if isinstance(message, Ready):
            return self.ready.set()
        if isinstance(message, NetReady) and message.store_host is not None:
            self.store_host = message.store_host
        with self._routes_lock:
            events = self._routes.get(message.run_dir)
            if isinstance(message, RunEnded):
                self._routes.pop(message.run_dir, None)
        if events is not None:
            events.put(message)

    def _on_death(self) -> None:
        self.alive = False
        self.ready.set()
        with self._routes_lock:
            waiting = {id(events): events for events in self._routes.values()}
            self._routes.clear()
        for events in waiting.values():
            events.put(ServerDied())

    def close(self) -> None:
        """Stop the server (it kills any rank still running) and reap it; a wedged one
        is killed with everything below it."""
        self.alive = False
        try:
            self.sock.shutdown(socket.SHUT_RDWR)  # wakes our reader thread; close alone won't
        except OSError:
            pass
        self.sock.close()
        try:
            self.process.wait(timeout=0 if self.wedged else CLOSE_WAIT_S)
        except subprocess.TimeoutExpired:
            self.kill()

    def kill(self) -> None:
        """SIGKILL the server and every process below it (ranks, leftovers), reap it."""
        self.alive, self.wedged = False, True
        if self.process.poll() is None:  # never signal a pid that was reaped: it may be reused
            process_tree.kill_tree(self.process.pid)
        self.process.wait()


# c10d looks up the host name of the first peer that connects to a store; in a shaped run's
# namespace there is no DNS, and the failed lookup printed this line into the caller's cell
# once per server (torch 2.13, socket.cpp). Harmless: the address itself is used.
HARMLESS = (b"The hostname of the client socket cannot be retrieved",)


def _pass_stderr(stream) -> None:
    """The namespaced server's stderr, passed on to ours but for HARMLESS lines."""
    with stream:
        for line in stream:
            if not any(text in line for text in HARMLESS):
                os.write(2, line)


def _server_env() -> dict[str, str]:
    """The server must import this very ddp_lab, installed or not."""
    env = dict(os.environ)
    env["PYTHONPATH"] = package_pythonpath(env)
    env.setdefault("OMP_NUM_THREADS", "1")  # the server itself never computes
    return env


class _Holder:
    """The process-wide server; a new one after a fork of this process or a death."""

    def __init__(self, prefix):
        self._prefix = prefix  # called for each new server: its command prefix
        self._lock = threading.Lock()
        self._server: ForkServer | None = None

    def get(self) -> ForkServer:
        with self._lock:
            server = self._server
            if server is None or not server.alive or server.pid_owner != os.getpid():
                if server is not None and server.pid_owner == os.getpid():
                    server.close()
                with deferred():  # a Ctrl-C now would leak a server nobody holds
                    self._server = ForkServer(self._prefix())
            elif not server.prefix:  # on the machine's network: if the setting has turned
                self._prefix()       # strict since, this refuses (network/isolation.py)
            return self._server

    def pid(self) -> int | None:
        """The running server's pid (None when there is none)."""
        return self.pids()[0] if self.pids() else None

    def pids(self) -> tuple[int, ...]:
        """The processes a launcher keeps between runs: the running server, and its store
        host once it has one (none: empty)."""
        server = self._server
        if server is None or not server.alive or server.pid_owner != os.getpid():
            return ()
        return tuple(filter(None, (server.process.pid, server.store_host)))

    def shutdown(self) -> None:
        with self._lock:
            if self._server is not None and self._server.pid_owner == os.getpid():
                self._server.close()
            self._server = None


_holders: dict[ServerKind, _Holder] = {}  # one server per kind (network/placement.py)
_holders_lock = threading.Lock()


def _holder(kind: ServerKind) -> _Holder:
    with _holders_lock:
        if kind not in _holders:
            _holders[kind] = _Holder(kind.prefix)
        return _holders[kind]


def fork_server_for(placement) -> ForkServer:
    """The server that forks the ranks of a run placed there (started if need be)."""
    return _holder(placement.server).get()


def fork_server_pid() -> int | None:
    """The server of runs on loopback (None while there is none)."""
    return _holder(PRIVATE_SERVER).pid()


def network_fork_server_pid() -> int | None:
    """The shaped runs' server (None before the first shaped run)."""
    return _holder(SHAPED_SERVER).pid()


def launcher_pids() -> set[int]:
    """The processes a launcher keeps between runs: its fork servers and their store hosts
    (none: empty)."""
    return {pid for holder in list(_holders.values()) for pid in holder.pids()}


def shutdown() -> None:
    """Stop every fork server (each is started again by the next run that needs it)."""
    for holder in list(_holders.values()):
        holder.shutdown()


atexit.register(shutdown)
