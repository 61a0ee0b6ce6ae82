"""A host's agent: ``python -m ddp_lab.launch.remote.agent --connect ADDRESS:PORT --index I``,
started on the host by the controller through ssh, srun or the user's own template
(remote/launchers.py), with the session's secret as the first line of its stdin.

It connects back to the controller, proves the secret (channel.py), says ``Hello`` and then
does what it is asked (messages.py): open the run's store (the first host), begin a session
of this host's ranks (host_ranks.py), pass calls to them, stop them, end the session.

Nothing of it outlives the controller: it exits at once (``os._exit``) when the channel
closes, when the controller has been silent for ``SILENCE_S`` (a cut link, a stopped or
killed kernel) or when its stdin closes (ssh or srun gone). Its fork server sees its socket
close and kills every rank with the rank's helpers; each rank's lifeline, held here,
closes too (forkserver/server.py, rank/main.py). So a kill of the agent itself leaves
nothing either.
"""

from __future__ import annotations

import argparse
import os
import queue
import signal
import socket
import sys
import threading
import time
import types

from ddp_lab.launch.interrupts import deferred
from ddp_lab.launch.remote.messages import (BEAT, BEAT_S, MESSAGE, SILENCE_S, Begin, CallDown,
                                            End, Ended, Failed, Hello, Hurry, OpenStore, StoreOpen,
                                            Stop, dumps)

CONNECT_S = 20.0


class Agent:
    """The main thread runs what the controller asks, one thing at a time; a reader thread
    takes messages off the channel (a ``Stop`` interrupts the call in flight, as Ctrl-C
    does in a notebook) and a beat thread tells the controller it is alive."""

    def __init__(self, channel, index: int):
        self.channel, self.index = channel, index
        self.interface = interface_of(channel.local_address)
        self.inbox: queue.Queue = queue.Queue()
        self.lock = threading.Lock()
        self.busy: int | None = None  # the call whose wait a Stop may interrupt
        self.unanswered: int | None = None  # the call not answered yet
        self.host = None  # host_ranks.HostRanks of the session, if one is begun
        self.store = None  # the run's TCPStore (the first host's agent holds it)

    def serve(self) -> None:
        self.send(Hello(self.index, self.channel.local_address, self.interface,
                        socket.gethostname(), os.getpid()))
        while True:
            message = self.inbox.get()
            try:
                self.handle(message)
            except KeyboardInterrupt:
                self._answer_late()
            except Exception as exc:  # noqa: BLE001 - said to the controller, which decides
                self.send(Failed(f"{type(exc).__name__}: {exc}"))

    def handle(self, message) -> None:
        match message:
            case OpenStore(world_size):
                from ddp_lab.launch.network.rendezvous import listening_store
                self.store, port = listening_store(self.channel.local_address, world_size)
                self.send(StoreOpen((self.channel.local_address, port)))
            case Begin():
                self._end_session()
                from ddp_lab.launch.remote.host_ranks import HostRanks
                self.host = HostRanks(self.channel, message, self.interface, self.index)
                self.send(self.host.begin())
            case CallDown():
                self.unanswered = message.seq
                self.host.call(message)
                self.send(self._wait(message.seq))
                self.unanswered = None
            case End():
                self._end_session(store_too=True)
                self.send(Ended())

    def _wait(self, seq: int):
        with self.lock:
            self.busy = seq
        try:
            return self.host.wait()
        finally:
            with self.lock:
                self.busy = None

    def _answer_late(self) -> None:
        """A Stop's signal landed as its call ended (after the session's wait, on its way
        out): the call is answered now (the controller ignores a second answer)."""
        with deferred():
            with self.lock:
                self.busy = None
            if self.unanswered is not None and self.host is not None:
                self.send(self.host.done(self.host.session.current))
            self.unanswered = None

    def _end_session(self, store_too: bool = False) -> None:
        """The host's ranks stopped; with ``store_too``, the first host's store too (a new
        session opens a new one: no key of the old group is left in it)."""
        host, self.host = self.host, None
        if host is not None:
            host.end()
        if store_too:
            self.store = None

    def on_message(self, message) -> None:
        """The reader thread's: a Stop of the call in flight interrupts it now; the rest
        waits its turn."""
        if isinstance(message, (Stop, Hurry)):
            with self.lock:
                if self.busy != message.seq:
                    return  # its call is over
                if isinstance(message, Hurry):
                    self.host.hurry(message.failed_age)
                else:  # a real signal: it ends the wait's select at once
                    signal.pthread_kill(threading.main_thread().ident, signal.SIGINT)
            return
        self.inbox.put(message)

    def send(self, message) -> None:
        try:
            self.channel.send(MESSAGE, dumps(message))
        except OSError as exc:
            leave(f"the controller cannot be reached ({exc})")


def read_channel(agent: Agent) -> None:
    """Every message in turn; silence for SILENCE_S or a closed channel ends the agent."""
    while True:
        try:
            message = agent.channel.recv(timeout=SILENCE_S)
        except TimeoutError:
            leave(f"the controller was silent for {SILENCE_S:g} s (a cut link, or a kernel "
                  "stopped or killed)")
        except OSError as exc:
            leave(f"the controller closed the connection ({type(exc).__name__})")
        if message.kind == MESSAGE:
            agent.on_message(message.unpickle())  # authenticated: channel.py


def beat(agent: Agent) -> None:
    while True:
        try:
            agent.channel.send(BEAT)
        except OSError as exc:
            leave(f"the controller does not take its messages ({type(exc).__name__})")
        time.sleep(BEAT_S)


def watch_stdin() -> None:
    """ssh and srun close the agent's stdin when they end (their client killed, Ctrl-C in
    a terminal): so does the agent."""
    while os.read(0, 1 << 12):
        pass
    leave("its stdin closed (the ssh or srun that started it is gone)")


def leave(why: str) -> None:
    """Exit now: the fork server, and so every rank of this host, follows (module doc)."""
    try:
        os.write(2, f"[ddp_lab agent] stopping: {why}\n".encode())
    finally:
        os._exit(3)


def interface_of(address: str) -> str:
    """The interface that holds ``address``: gloo's on this host."""
    import psutil
    for name, addresses in psutil.net_if_addrs().items():
        if any(a.address == address for a in addresses):
            return name
    raise RuntimeError(f"no interface of this host holds {address}")


def _daemon(target, *args) -> None:
    threading.Thread(target=target, args=args, daemon=True, name=target.__name__).start()


def main(argv: list[str] | None = None) -> None:
    args = _parser().parse_args(argv)
    signal.signal(signal.SIGINT, signal.default_int_handler)  # a Stop's (even if inherited
    # ignored from the launcher): it interrupts the call's wait only (Agent.on_message)
    from ddp_lab.launch.remote.channel import Channel
    from ddp_lab.launch.remote.handshake import AGENT
    from ddp_lab.launch.remote.secret import read_secret
    host, _, port = args.connect.rpartition(":")
    key = read_secret(0, timeout=CONNECT_S)
    channel = Channel.connect((host.strip("[]"), int(port)), key, AGENT, timeout=CONNECT_S)
    agent = Agent(channel, args.index)
    _daemon(watch_stdin)
    _daemon(read_channel, agent)
    _daemon(beat, agent)
    _warm_fork_server()
    agent.serve()


def _warm_fork_server() -> None:
    """This host's fork server starts importing torch now, while the controller waits for
    every host's hello."""
    from ddp_lab.launch.forkserver.client import fork_server_for
    from ddp_lab.launch.network.placement import HOST_SERVER
    fork_server_for(types.SimpleNamespace(server=HOST_SERVER))


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m ddp_lab.launch.remote.agent",
                                     description="a host's agent of ddp_lab's live ranks")
    parser.add_argument("--connect", required=True, help="the controller's ADDRESS:PORT")
    parser.add_argument("--index", type=int, required=True, help="this host's index")
    return parser


if __name__ == "__main__":
    sys.exit(main())
