"""Everything a session on several hosts creates before its first call, and removes at its
close: the session's secret, a listener on the controller's address (one interface, closed
once every agent is in), a launcher and an agent per host, their channels, the beats.
"""

from __future__ import annotations

import contextlib
import queue
import threading
import time

from ddp_lab.launch.interrupts import deferred
from ddp_lab.launch.remote.links import START_S, HostLink, accept_all, beat_all
from ddp_lab.launch.remote.messages import End

END_SESSION_S = 5.0  # for an agent to close its session (its ranks killed, its folder gone)


class HostsStart:
    """``connect`` (every agent in, or an error that names the host and says why), the
    links by host index, ``end_sessions``, ``close`` (idempotent, Ctrl-C held back)."""

    def __init__(self, placement):
        self.placement = placement
        self.links: list[HostLink] = []
        self._cleanup = contextlib.ExitStack()
        self._stop_beats = threading.Event()

    def connect(self, inbox: queue.Queue) -> None:
        from ddp_lab.launch.remote.channel import listener
        from ddp_lab.launch.remote.launchers import agent_command, launcher_argv
        from ddp_lab.launch.remote.secret import SessionKey
        key = SessionKey.new()
        with deferred():
            server = listener(self.placement.controller)
            self._cleanup.callback(server.close)
        address = server.getsockname()[:2]
        for index, name in enumerate(self.placement.names):
            argv = launcher_argv(self.placement.template, name, agent_command(address, index))
            with deferred():
                link = HostLink(index, name, argv)
                self.links.append(link)
                self._cleanup.callback(link.close)
                link.launch(key, inbox)
        accept_all(self.links, server, key, time.monotonic() + START_S)
        server.close()  # every agent is in: nobody else may even try
        for link in self.links:
            link.read(inbox)
        beat_all(self.links, self._stop_beats)
        self._cleanup.callback(self._stop_beats.set)

    def name(self, index: int) -> str:
        return self.placement.names[index]

    def drop(self, index: int) -> None:
        """A host that is lost: its link closed (its agent, if it still runs, ends)."""
        self.links[index].close()

    def end_sessions(self) -> None:
        """Every host's ranks stopped (the agents stay until ``close``)."""
        for link in self.links:
            link.send(End())

    def close(self) -> None:
        with deferred():
            self._cleanup.close()
