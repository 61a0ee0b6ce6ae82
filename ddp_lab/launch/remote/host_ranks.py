"""One host's share of live ranks, as its agent runs them: a local ``LiveSession`` (the fork
server, the pipes, the deadline, the stacks of a hang, the stop button, the cleanup: all
of it the one-machine code) whose ranks are numbered globally (placement ``OnHost``), whose
output goes to the controller as it comes (``ForwardEcho``) and whose calls end in a
``CallDone`` in global ranks.
"""

from __future__ import annotations

import os
import sys
import time

from ddp_lab.launch.config import LaunchConfig
from ddp_lab.launch.live.frames import Reply
from ddp_lab.launch.live.session import LiveSession
from ddp_lab.launch.network.placement import OnHost
from ddp_lab.launch.output.echo import PlainEcho
from ddp_lab.launch.remote.messages import (MESSAGE, Begin, CallDone, CallDown, Lines, RankEnd,
                                            age, dumps, failure_timed, since)


class ForwardEcho(PlainEcho):
    """The ranks' lines to the controller, tagged with their global rank; the controller's
    echo shows them (and keeps them for ``res.logs``)."""

    def __init__(self, channel, first_rank: int):
        super().__init__()
        self.channel, self.first_rank = channel, first_rank

    def show(self, owner, lines: list[str], status: str | None = None) -> None:
        if lines or status is not None:
            self.channel.send(MESSAGE, dumps(Lines(self.first_rank + owner, list(lines),
                                                   status)))

    def note(self, text: str) -> None:
        pass  # the controller beats for the whole session


class HostRanks:
    """``begin`` (call 0: the group is up), ``call`` as often as asked, ``end``."""

    def __init__(self, channel, begin: Begin, interface: str, host_index: int):
        self.first = begin.first_rank
        if os.path.isdir(begin.cwd):  # the hosts share the notebook's files, as clusters do
            os.chdir(begin.cwd)
        shared = [path for path in begin.sys_path if path and os.path.isdir(path)]
        sys.path[:] = list(dict.fromkeys([*shared, *sys.path]))  # what rank_spec hands on
        placement = OnHost(store=tuple(begin.store), interface=interface,
                           first_rank=begin.first_rank, world_size=begin.world_size,
                           host_index=host_index, host_count=begin.host_count)
        config = LaunchConfig(world_size=begin.nproc, backend=begin.backend,
                              timeout=begin.timeout, env=dict(begin.env), echo=False,
                              placement=placement)
        self.session = LiveSession(config, echo_to=lambda: ForwardEcho(channel, self.first))

    def begin(self) -> CallDone:
        self.session.start()
        return self.done(self.session.wait())

    def call(self, message: CallDown) -> None:
        bodies = {rank - self.first: body for rank, body in message.bodies.items()}
        self.session.call(message.kind, bodies, message.timeout)

    def wait(self) -> CallDone:
        """Until this host's part of the call is over; a stop (KeyboardInterrupt, raised by
        the agent's reader) ends it as the stop button ends a local call."""
        try:
            call = self.session.wait()
        except KeyboardInterrupt:
            call = self.session.current
        return self.done(call)

    def hurry(self, failed_age: float) -> None:
        """A rank failed on another host: the grace starts here too (the session's run
        loop looks at the call's deadline at least every quarter second)."""
        call = self.session.current
        if call is not None and call.first_failure is None:
            call.first_failure = since(failed_age)

    def end(self) -> None:
        self.session.close()

    def done(self, call) -> CallDone:
        """The call in global ranks, with how each of the host's ranks stands."""
        g = self.first
        now = time.monotonic()
        return CallDone(
            seq=call.seq, replies={g + r: _portable(reply, g + r, now)
                                   for r, reply in call.replies.items()},
            stuck=[g + r for r in call.stuck], stacks={g + r: s for r, s in call.stacks.items()},
            died=[g + r for r in call.died], lost=self.session.lost,
            ranks=[self._rank_end(state, now) for state in self.session.ranks],
            first_failure_age=age(call.first_failure, now))

    def _rank_end(self, state, now: float) -> RankEnd:
        failure = None
        if state.exit_time is not None:
            found = self.session.dead_rank_failure(state.rank)
            failure = failure_timed(found.to_plain(), lambda t: age(t, now)) if found else None
        return RankEnd(self.first + state.rank, state.exitcode, age(state.exit_time, now),
                       state.stopped_by_launcher, failure)


def _portable(reply: Reply, rank: int, now: float) -> Reply:
    """A reply with its global rank, and a failure's time as an age."""
    if reply.status != "ok":
        return Reply(reply.seq, rank, reply.status,
                     failure_timed(reply.body, lambda t: age(t, now)))
    return Reply(reply.seq, rank, reply.status, reply.body)
