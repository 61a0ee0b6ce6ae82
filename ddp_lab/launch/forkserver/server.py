"""The fork server: a fresh Python process that imports torch once, then forks ranks.

Why: a launch that starts interpreters pays ~2 s per rank importing torch (that is most of
torchrun's and mp.spawn's time on a laptop). Forking from a process that already imported
torch costs milliseconds, and since this process is started with exec (never a fork of the
Jupyter kernel) and never initializes CUDA or OpenMP threads itself, forking it is safe even
when the kernel has touched the GPU.

The messages it answers and sends are protocol.py's (``SpawnRank`` -> ``Spawned``, then
``Exited``; ``SignalRank``; ``EndRun`` -> ``RunEnded``; ``NetUp`` ->
``NetReady``), handled in one place, ``Server._on_message``. When the launcher goes away
(end of file on the socket) every rank and leftover is killed and the server exits.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import selectors
import shutil
import signal
import socket
import sys
import warnings

from ddp_lab.launch.deadlines import SERVER_POLL_S
from ddp_lab.launch.forkserver import process_tree, protocol
from ddp_lab.launch.forkserver.protocol import (EndRun, Exited, NetReady, NetUp, Ready, RunEnded,
                                                SignalRank, SpawnRank, Spawned)
from ddp_lab.launch.forkserver.reaper import Reaper
from ddp_lab.launch.forkserver.store_host import Stores
from ddp_lab.launch.network.rendezvous import LOOPBACK

PRELOAD = ("torch", "torch.distributed", "torch.nn", "torch.optim", "torch.nn.parallel",
           "cloudpickle", "numpy", "psutil", "ddp_lab.launch.rank.main")
# DDP's constructor imports torch._dynamo (~1-3 s per rank, far more on busy cores, and every
# rank of a run pays it at once); it brings FSDP and DTensor along, and the checkpoint package
# (notebooks 10 and 11) costs a fraction of a second more. The server imports them before it
# says "ready", with torch: the first call pays about a second more, and every later call,
# the second included, is warm (a server that imported them after its first run made the
# second call wait for that import instead). Ranks forked with torch._dynamo loaded made a
# race in torch's teardown likelier (the DDP tutorial's cleanup() hung); rank/main.py
# defuses it for every rank, see rank/teardown.py.
WARM = ("torch._dynamo", "torch.distributed.fsdp", "torch.distributed.checkpoint")


def preload() -> None:
    for name in PRELOAD + WARM:
        importlib.import_module(name)


class Server:
    def __init__(self, sock: socket.socket):
        self.sock = sock
        self.reaper = Reaper()
        self.ending: set[str] = set()  # runs whose launcher waits for ("run-ended", run)
        self.run_dirs: set[str] = set()  # folders to remove should the launcher die
        self.wake_r, wake_w = os.pipe()
        os.set_blocking(wake_w, False)
        signal.set_wakeup_fd(wake_w)
        signal.signal(signal.SIGCHLD, lambda *_: None)
        self.wake_w = wake_w
        self.switch = None  # switch.Switch, made by the first shaped run
        self.stores = Stores(self.reaper.own)  # every run's store, in a child (store_host.py)

    def serve(self) -> None:
        selector = selectors.DefaultSelector()
        selector.register(self.sock, selectors.EVENT_READ, self._on_message)
        selector.register(self.wake_r, selectors.EVENT_READ, self._on_sigchld)
        while True:
            events = selector.select(self._select_timeout())
            for key, _ in events:
                if key.data() is False:
                    return self.shutdown()
            if not self._tidy():
                return self.shutdown()

    def _select_timeout(self) -> float | None:
        if self.reaper.doomed or self.ending:  # leftovers do not all wake us when they exit
            return SERVER_POLL_S
        return None

    def _tidy(self) -> bool:
        if not (self.reaper.doomed or self.ending):
            return True
        self.reaper.sweep()
        return self._answer_ended()

    def _on_message(self) -> bool:
        """The one dispatch of what the launcher asks (protocol.py); False: it is gone."""
        message, fds = protocol.receive(self.sock)
        match message:
            case None:
                return False
            case SpawnRank(spec):
                return self.spawn(spec, fds)
            case SignalRank(pid, signum):
                self.signal_rank(pid, signum)
            case NetUp(run_dir, world_size, plan):
                return self.net_up(run_dir, world_size, plan)
            case EndRun(run_dir):
                self.ending.add(run_dir)
                self.reaper.sweep()
                return self._answer_ended()
        return True

    def _on_sigchld(self) -> bool:
        os.read(self.wake_r, 4096)
        return self.reap()

    def net_up(self, run_dir: str, world_size: int, plan) -> bool:
        """The run's store (and a shaped run's links first), in this server's private
        network (network/isolation.py), where the ranks reach it and nobody else can; the
        store is hosted by a child that never forks (store_host.py)."""
        try:
            host = self._shaped_net(run_dir, world_size, plan) if plan is not None else LOOPBACK
            address = (host, self.stores.open(run_dir, host, world_size))
        except Exception as exc:  # noqa: BLE001 - every failure goes back as a message
            if self.switch is not None:
                self.switch.down(run_dir)
            return self._tell(NetReady(run_dir, None, f"{type(exc).__name__}: {exc}"))
        self.run_dirs = {d for d in self.run_dirs if os.path.exists(d)} | {run_dir}
        return self._tell(NetReady(run_dir, address, None, self.stores.host.pid))

    def _shaped_net(self, run_dir: str, world_size: int, plan) -> str:
        """A shaped run's links (network/switch.py); the store's address on their bridge."""
        from ddp_lab.launch.network.switch import Switch
        self.switch = self.switch or Switch()
        return self.switch.up(run_dir, world_size, plan).address

    def spawn(self, spec, fds: list[int]) -> bool:
        sys.stdout.flush()
        sys.stderr.flush()
        with self._rank_network(spec):
            pid = os.fork()
            if pid == 0:
                self._become_rank(spec, fds)
        _setpgid_quietly(pid)  # also done in the child: whichever runs first wins the race
        for fd in fds:
            os.close(fd)
        self.reaper.add_rank(pid, spec.run_dir)
        self.run_dirs = {d for d in self.run_dirs if os.path.exists(d)} | {spec.run_dir}
        return self._tell(Spawned(spec.run_dir, spec.rank, pid))

    def _rank_network(self, spec):
        """A rank whose placement gives it a namespace of its own (``spec.network``: the
        placement's ``rank_netns``, network/placement.py) is forked inside it."""
        if spec.network:
            return self.switch.inside(spec.run_dir, spec.rank)
        return contextlib.nullcontext()

    def _become_rank(self, spec, fds: list[int]) -> None:
        try:
            if self.switch is not None:
                self.switch.close_in_child()
            signal.set_wakeup_fd(-1)
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)
            for fd in (self.wake_r, self.wake_w, self.sock.fileno()):
                os.close(fd)
            self.stores.close_in_child()
            from ddp_lab.launch.rank.main import rank_main
            rank_main(spec, output_fd=fds[0], lifeline_fd=fds[1], body=_live_body(fds[2:]))
        finally:
            os._exit(70)  # never fall back into the server loop

    def signal_rank(self, pid: int, signum: int) -> None:
        """SIGKILL takes the rank's helpers down too; other signals (SIGUSR1: dump your
        stack) are for the rank alone."""
        if pid not in self.reaper.ranks:
            return
        if signum == signal.SIGKILL:
            self.reaper.kill_rank(pid)
        else:
            process_tree.send(pid, signum)

    def reap(self) -> bool:
        """Reap every child (ranks, and orphans adopted as subreaper); report the ranks."""
        for run, pid, exitcode in self.reaper.reap():
            if not self._tell(Exited(run, pid, exitcode)):
                return False
        self.reaper.sweep()
        return self._answer_ended()

    def _answer_ended(self) -> bool:
        for run in [r for r in self.ending if self.reaper.is_over(r)]:
            self.ending.discard(run)
            self.reaper.forget(run)
            self.stores.close(run)
            if self.switch is not None:
                self.switch.down(run)
            if not self._tell(RunEnded(run)):
                return False
        return True

    def _tell(self, message) -> bool:
        try:
            protocol.send(self.sock, message)
            return True
        except OSError:
            return False  # the launcher is gone

    def shutdown(self) -> None:
        """The launcher is gone: stop every rank and leftover, remove the run folders."""
        self.reaper.kill_everything()  # the store host too: it is below this server
        for run_dir in list(self.switch.runs if self.switch else ()):
            self.switch.down(run_dir)
        for run_dir in self.run_dirs:
            shutil.rmtree(run_dir, ignore_errors=True)


def _live_body(fds: list[int]):
    """A live rank's loop of calls (calls in, replies out: live/), or None: a one-shot rank."""
    if not fds:
        return None
    import functools

    from ddp_lab.launch.live.rank_loop import serve_calls
    return functools.partial(serve_calls, calls_fd=fds[0], replies_fd=fds[1])


def _setpgid_quietly(pid: int) -> None:
    try:
        os.setpgid(pid, pid)
    except OSError:
        pass  # the child already did it, or already exec'd/exited


def main(argv: list[str]) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the launcher's to handle
    # Python 3.12 warns on every fork of a process that has threads, and this one has those
    # torch's import starts. Forking it is this server's design (module docstring); the
    # warning would reach every run's cell (seen with Python 3.12 on a GPU machine).
    warnings.filterwarnings("ignore", message=r"This process .* is multi-threaded, use of fork",
                            category=DeprecationWarning)
    sock = socket.socket(fileno=int(argv[0]))
    preload()
    server = Server(sock)
    if server._tell(Ready()):
        server.serve()
    _exit_at_once()


def _exit_at_once() -> None:
    """Everything is put down by now: skip the interpreter's teardown of torch (about half
    a second to a second, which the launcher's exit, and so a kernel's shutdown, waits for)."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    main(sys.argv[1:])
