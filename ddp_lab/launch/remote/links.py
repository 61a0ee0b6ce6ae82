"""The controller's side of the hosts: each host's agent started through its launcher (ssh,
srun, a template), its channel accepted once it proves the session's secret, and what it
says handed to one queue, with the launcher's own error output and the link's loss.

One reader thread per host keeps reading, between calls too: the agents' beats never pile
up, and a host that falls silent for ``SILENCE_S`` is reported lost (``LinkLost``) even
while the notebook idles. One beat thread tells every agent the controller lives.
"""

from __future__ import annotations

import os
import queue
import select
import signal
import subprocess
import threading
import time
from dataclasses import dataclass

from ddp_lab.launch.remote.messages import BEAT, BEAT_S, MESSAGE, SILENCE_S, Hello, dumps

START_S = 60.0  # for every agent to connect: ssh, Python's start, this ddp_lab's import
END_S = 3.0     # for a launcher to exit once its agent's channel and stdin are closed
MAX_KNOCKS = 64  # threads of this process beyond which a knock at the listener is refused


@dataclass(frozen=True)
class LinkLost:
    host_index: int
    why: str


@dataclass(frozen=True)
class LauncherSaid:
    host_index: int
    line: str


class HostLink:
    """One host: its launcher process (``process``), its channel once accepted."""

    def __init__(self, index: int, name: str, argv: list[str]):
        self.index, self.name, self.argv = index, name, argv
        self.process: subprocess.Popen | None = None
        self.channel = None
        self.hello: Hello | None = None
        self.said: list[str] = []  # the launcher's stderr, for an error that says why
        self.stderr_reader: threading.Thread | None = None

    def launch(self, key, inbox: queue.Queue) -> None:
        """Start the launcher (in a session of its own: Ctrl-C in a terminal is ours to
        pass on) and hand it the secret on stdin, kept open: its end ends the agent."""
        from ddp_lab.launch.remote.secret import write_secret
        self.process = subprocess.Popen(self.argv, stdin=subprocess.PIPE,
                                        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                        start_new_session=True)
        self.stderr_reader = _daemon(self._read_stderr, inbox)
        try:
            write_secret(self.process.stdin.fileno(), key)
        except BrokenPipeError:
            pass  # it exited at once: accept_all says so, with what it printed

    def _read_stderr(self, inbox: queue.Queue) -> None:
        try:
            for raw in iter(self.process.stderr.readline, b""):
                line = raw.decode(errors="replace").rstrip("\n")
                self.said.append(line)
                del self.said[:-40]
                inbox.put(LauncherSaid(self.index, line))
        except (OSError, ValueError):
            pass  # closed under it: a launcher's child kept it open past close's wait

    def why_gone(self) -> str:
        code = self.process.poll() if self.process else None
        tail = "\n".join(self.said[-12:]) or "(it printed nothing)"
        return (f"`{self.argv[0]}` exited with {code}" if code is not None else
                f"`{self.argv[0]}` still runs") + f":\n{tail}"

    def read(self, inbox: queue.Queue) -> None:
        """The reader thread: each message, then ``LinkLost`` once."""
        _daemon(self._read, inbox)

    def _read(self, inbox: queue.Queue) -> None:
        while True:
            try:
                message = self.channel.recv(timeout=SILENCE_S)
            except TimeoutError:
                return inbox.put(LinkLost(self.index, f"silent for {SILENCE_S:g} s: the link "
                                          "is cut, or the host or its agent is stopped"))
            except OSError as exc:
                return inbox.put(LinkLost(self.index, f"its agent closed the connection "
                                          f"({type(exc).__name__}: {exc})"))
            if message.kind == MESSAGE:
                inbox.put((self.index, message.unpickle()))  # authenticated (channel.py)

    def send(self, message) -> bool:
        """False if the link is gone (its reader reports that)."""
        try:
            self.channel.send(MESSAGE, dumps(message))
            return True
        except OSError:
            return False

    def close(self) -> None:
        """Close the channel and the launcher's stdin (the agent exits at either), then
        wait for the launcher; kill its process group if it lingers."""
        if self.channel is not None:
            self.channel.close()
        if self.process is None:
            return
        try:
            self.process.stdin.close()
        except OSError:
            pass
        try:
            self.process.wait(END_S)
        except subprocess.TimeoutExpired:
            _kill_group(self.process)
        if self.stderr_reader is not None:
            self.stderr_reader.join(END_S)  # it ends at the end of the launcher's stderr
        self.process.stderr.close()


def accept_all(links: list[HostLink], server, key, until: float) -> None:
    """Each host's agent, as it proves the secret and says hello; a launcher that exits
    first (ssh refused, python missing) ends the wait with what it printed. Each knock is
    answered in a thread of its own: a stranger who connects and says nothing holds up
    only its own handshake (HANDSHAKE_S), never the agents' (at most MAX_KNOCKS at once)."""
    waiting = {link.index: link for link in links}
    arrived: queue.Queue = queue.Queue()
    over = threading.Event()
    try:
        while waiting:
            _check_launchers(waiting, until)
            if select.select([server], [], [], 0.1)[0]:
                sock, _ = server.accept()
                if threading.active_count() > MAX_KNOCKS:
                    sock.close()  # a flood of strangers: they wait their turn elsewhere
                else:
                    _daemon(_handshake, sock, key, arrived, over)
            _take_arrivals(arrived, waiting)
    finally:
        over.set()  # a handshake that ends from now on closes its channel itself
        _take_arrivals(arrived, {})


def _check_launchers(waiting: dict, until: float) -> None:
    for link in waiting.values():
        if link.process.poll() is not None:
            raise RuntimeError(f"the agent on host {link.name!r} did not start: "
                               f"{link.why_gone()}")
    if time.monotonic() >= until:
        names = ", ".join(repr(link.name) for link in waiting.values())
        raise TimeoutError(f"no agent answered from {names} within {START_S:g} s: "
                           + "; ".join(link.why_gone() for link in waiting.values()))


def _handshake(sock, key, arrived: queue.Queue, over: threading.Event) -> None:
    """One knock: the handshake and the hello, or nothing (the socket closed)."""
    from ddp_lab.launch.remote.channel import Channel
    from ddp_lab.launch.remote.channel_errors import ChannelError
    from ddp_lab.launch.remote.handshake import CONTROLLER, HANDSHAKE_S
    try:
        channel = Channel.over(sock, key, CONTROLLER, HANDSHAKE_S)
    except (ChannelError, OSError):
        return  # no proof of the secret: closed, nothing taken
    hello = _first_message(channel)
    if over.is_set() or not isinstance(hello, Hello):
        channel.close()
        return
    arrived.put((channel, hello))


def _take_arrivals(arrived: queue.Queue, waiting: dict) -> None:
    while True:
        try:
            channel, hello = arrived.get_nowait()
        except queue.Empty:
            return
        link = waiting.pop(hello.host_index, None)
        if link is None:
            channel.close()  # it knew the secret, yet is no host we wait for: not ours
        else:
            link.channel, link.hello = channel, hello


def _first_message(channel, timeout: float = 10.0):
    """The agent's first message past its beats (its hello), None if none came in time."""
    until = time.monotonic() + timeout
    try:
        while (message := channel.recv(timeout=max(0.0, until - time.monotonic()))).kind != MESSAGE:
            pass
    except (TimeoutError, OSError):
        return None
    return message.unpickle()


def beat_all(links: list[HostLink], stop: threading.Event) -> None:
    """The controller's beat to every agent, until ``stop``."""
    def beat() -> None:
        while not stop.wait(BEAT_S):
            for link in links:
                try:
                    if link.channel is not None:
                        link.channel.send(BEAT)
                except OSError:
                    pass  # its reader reports the loss
    _daemon(beat)


def _kill_group(process: subprocess.Popen) -> None:
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except OSError:
        pass
    process.wait()


def _daemon(target, *args) -> threading.Thread:
    thread = threading.Thread(target=target, args=args, daemon=True,
                              name=f"ddp_lab-hosts-{target.__name__}")
    thread.start()
    return thread
