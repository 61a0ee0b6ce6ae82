"""The launcher's side of the fork server: start it once per process, spawn ranks through it.

One server per launcher process is the point (torch is imported once, later launches are
near-instant), so it is kept in a process-wide holder. It is started lazily by the first run,
restarted if it died, and dies with this process: it watches its end of the socket, so even
a SIGKILL of the kernel makes it kill every rank and exit.
"""

from __future__ import annotations

import atexit
import itertools
import os
import queue
import socket
import subprocess
import sys
import threading

from ddp_lab.launch import channel, process_tree
from ddp_lab.launch.environment import package_pythonpath
from ddp_lab.launch.interrupts import deferred

SPAWN_REPLY_TIMEOUT = 120.0  # the first reply waits for the server to import torch
SEND_TIMEOUT_S = 2.0  # a server that reads nothing for this long is wedged (or SIGSTOPped)
CLOSE_WAIT_S = 10.0  # how long a closed server gets to put its runs' leftovers down


class ForkServerDied(RuntimeError):
    """The fork server is gone (or stopped answering); the next run starts a new one."""


class ForkServer:
    def __init__(self):
        self.sock, theirs = channel.socket_pair()
        self.process = subprocess.Popen(
            [sys.executable, "-m", "ddp_lab.launch.zygote", str(theirs.fileno())],
            pass_fds=[theirs.fileno()], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
            env=_server_env(), start_new_session=True)
        theirs.close()
        self.pid_owner = os.getpid()
        self._send_lock = threading.Lock()
        self._ids = itertools.count()
        self._routes: dict[int, queue.Queue] = {}  # request id, then pid -> the run's queue
        self._routes_lock = threading.Lock()
        self.alive = True
        self.wedged = False  # it stopped reading our messages: only killing it helps
        threading.Thread(target=self._read_replies, name="ddp_lab-forkserver", daemon=True).start()

    def spawn(self, spec, fds: list[int], events: queue.Queue) -> None:
        """Ask for one rank; its ("spawned", pid) and ("exited", pid, code) go to ``events``."""
        request_id = next(self._ids)
        with self._routes_lock:
            self._routes[-1 - request_id] = events
        self._send(("spawn", request_id, spec), fds)

    def signal(self, pid: int, signum: int) -> None:
        try:
            self._send(("signal", pid, signum))
        except ForkServerDied:
            pass  # dead: it killed every rank on its way out; wedged: the caller kills it

    def end_run(self, run_dir: str, events: queue.Queue) -> None:
        """Ask for ("run-ended", run_dir) in ``events`` once the run's leftovers are gone."""
        with self._routes_lock:
            self._routes[("run", run_dir)] = events
        self._send(("end-run", run_dir))

    def _send(self, message: tuple, fds: list[int] = ()) -> None:
        if self.wedged:
            raise ForkServerDied("the ddp_lab fork server stopped answering")
        try:
            with self._send_lock:
                channel.send(self.sock, message, fds, timeout=SEND_TIMEOUT_S)
        except TimeoutError as exc:
            self.alive, self.wedged = False, True
            raise ForkServerDied("the ddp_lab fork server stopped answering") from exc
        except OSError as exc:
            self.alive = False
            raise ForkServerDied(f"the ddp_lab fork server is gone ({exc})") from exc

    def _read_replies(self) -> None:
        while True:
            try:
                message, _fds = channel.receive(self.sock)
            except OSError:
                message = None
            if message is None:
                return self._on_death()
            self._route(message)

    def _route(self, message: tuple) -> None:
        kind, key, *rest = message
        with self._routes_lock:
            if kind == "spawned":
                events = self._routes.pop(-1 - key)
                self._routes[rest[0]] = events
                events.put(("spawned", rest[0]))
            elif kind == "exited" and key in self._routes:
                self._routes.pop(key).put(("exited", key, rest[0]))
            elif kind == "run-ended" and ("run", key) in self._routes:
                self._routes.pop(("run", key)).put(("run-ended", key))

    def _on_death(self) -> None:
        self.alive = False
        with self._routes_lock:
            waiting = {id(events): events for events in self._routes.values()}
            self._routes.clear()
        for events in waiting.values():
            events.put(("server-died",))

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


def _server_env() -> dict[str, str]:
    """The server must import this very ddp_lab, installed or not."""
    env = dict(os.environ)
    env["PYTHONPATH"] = package_pythonpath(env)
    env.setdefault("OMP_NUM_THREADS", "1")  # the server itself never computes
    return env


class _Holder:
    """The process-wide server; a new one after a fork of this process or a death."""

    def __init__(self):
        self._lock = threading.Lock()
        self._server: ForkServer | None = None

    def get(self) -> ForkServer:
        with self._lock:
            server = self._server
            if server is None or not server.alive or server.pid_owner != os.getpid():
                if server is not None and server.pid_owner == os.getpid():
                    server.close()
                with deferred():  # a Ctrl-C now would leak a server nobody holds
                    self._server = ForkServer()
            return self._server

    def pid(self) -> int | None:
        """The running server's pid (None when there is none): it is the one process a
        launcher keeps between runs."""
        server = self._server
        alive = server is not None and server.alive and server.pid_owner == os.getpid()
        return server.process.pid if alive else None

    def shutdown(self) -> None:
        with self._lock:
            if self._server is not None and self._server.pid_owner == os.getpid():
                self._server.close()
            self._server = None


_holder = _Holder()
atexit.register(_holder.shutdown)
get_fork_server = _holder.get
shutdown = _holder.shutdown
fork_server_pid = _holder.pid
