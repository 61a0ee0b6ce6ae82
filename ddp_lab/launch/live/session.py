"""The kernel's side of live ranks: one ``Session`` whose ranks do not exit, and the calls
made to them.

The processes, the run folder, the rendezvous, the output and the cleanup are a one-shot
run's (launch/session.py), and so is the contract (``api.LiveRunSession``). A live session
changes only what ``Session`` declares it may: two pipes per rank (calls down, replies up:
its ``rank_pipes``), and the public ``start`` (the ranks' ready reply is call 0), ``wait``
("until every rank exited" becomes "until every rank replied") and ``record`` (a call's,
held in memory: live/outcome.py). What happens to the ranks after a failure is decided
here and said on the exception (``err.session``): ``"kept"`` (every rank answered:
namespaces intact), ``"restart"`` (some rank cannot answer, or a group operation timed out:
handle.py starts new ones) or ``"stopped"`` (a rank died).
"""

from __future__ import annotations

import functools
import os
import signal
import time
from dataclasses import dataclass, field

from ddp_lab.launch.deadlines import CALL_SEND_WAIT_S, INTERRUPT_WAIT_S, KILL_WAIT_S, Deadline
from ddp_lab.launch.errors import describe_ranks
from ddp_lab.launch.interrupts import deferred
from ddp_lab.launch.live.frames import Call, FrameReader, RankGone, Reply, send
from ddp_lab.launch.live.outcome import call_record
from ddp_lab.launch.rank.failure import read_failure
from ddp_lab.launch.output.heartbeat import Heartbeat
from ddp_lab.launch.session import Session
from ddp_lab.launch.verdict.record import RunRecord


@dataclass
class CallState:
    """One call in flight: who was asked, who answered, how it ended."""

    seq: int
    targets: list[int]
    timeout: float
    started: float = field(default_factory=time.monotonic)
    replies: dict[int, Reply] = field(default_factory=dict)
    first_failure: float | None = None
    stuck: list[int] = field(default_factory=list)
    stacks: dict[int, str] = field(default_factory=dict)
    died: list[int] = field(default_factory=list)
    over: bool = False  # every target replied, a rank died, or the deadline says stop

    @property
    def pending(self) -> list[int]:
        return [r for r in self.targets if r not in self.replies]

    def ends_at(self) -> float:
        """The deadline, or the grace after the first failure (deadlines.Deadline)."""
        return Deadline(self.started, self.timeout).ends_at(self.first_failure)


class LiveSession(Session):
    """``start()`` and ``wait()`` (ready), then ``call(kind, bodies, timeout)`` and ``wait()``
    as often as wanted, ``record()`` for a call's verdict, then ``close()``."""

    def __init__(self, config, echo_to=None):
        super().__init__(config, payload=None, rank_pipes=self._call_pipes, echo_to=echo_to)
        self.frames = [FrameReader() for _ in range(config.world_size)]
        self.seq = 0
        self.current: CallState | None = None  # the call in flight, or the latest one
        self.lost: str | None = None  # why no more calls can run (a rank died, or would not stop)

    # -- start ----------------------------------------------------------------------------
    def _call_pipes(self, rank: int) -> list[int]:
        """Calls down (this end kept, never blocking), replies up (read by the output reader
        into the rank's frames); the rank's ends returned for the fork server to pass on."""
        calls_r, calls_w = os.pipe()
        self.own_fd(f"calls{rank}", calls_w)
        os.set_blocking(calls_w, False)
        try:
            replies_r, replies_w = os.pipe()
        except OSError:
            os.close(calls_r)
            raise
        self.output.add(replies_r, route=self.frames[rank])
        return [calls_r, replies_w]

    def start(self) -> None:
        """Start the ranks; each says it is ready (its group is up) as reply 0 of call 0,
        which ``wait`` awaits."""
        super().start()
        self.current = CallState(0, list(range(self.config.world_size)), self.config.timeout)

    # -- a call ---------------------------------------------------------------------------
    def call(self, kind: str, bodies: dict[int, object], timeout: float) -> CallState:
        """Send ``bodies[rank]`` to each rank in it; ``wait`` then returns once each replied,
        failed, died or hung (then with its stack, and interrupted if it could be)."""
        if self.lost:
            raise RuntimeError(self.lost)
        self.seq += 1
        call = self.current = CallState(self.seq, sorted(bodies), timeout)
        self.echo = self.new_echo()
        self._new_logs()
        try:
            for rank in call.targets:
                self._send(call, rank, Call(call.seq, kind, bodies[rank]))
        except BaseException as exc:
            self._cut_short(call, exc)
            raise
        return call

    def wait(self) -> CallState:
        """Until the current call is over (``call`` says when); the call, with its replies."""
        call = self.current
        if call.seq == 0:  # the ready replies: a Ctrl-C here is the start's, close follows
            return self._finish(call)
        try:
            self._finish(call)
        except BaseException as exc:
            self._cut_short(call, exc)
            raise
        self.echo.close()
        return call

    def record(self) -> RunRecord:
        """The latest call as a run record, as ``outcome.conclude`` judges a failed one."""
        return call_record(self, self.current)

    def _cut_short(self, call: CallState, exc: BaseException) -> None:
        """A call ended by an exception: the stop button reaches its ranks; its echo ends."""
        if isinstance(exc, KeyboardInterrupt):
            self._on_stop_button(call)
        self.echo.close()

    def _new_logs(self) -> None:
        """What the ranks printed between calls (a thread of theirs) is shown now, then
        every rank's log starts afresh: each call's RunResult has the lines of its own, and
        the session keeps no history that grows with every call."""
        for out in self.output.read_ready(time.monotonic() + 0.5):
            self._show(out)
        for state in self.ranks:
            state.lines.clear()

    def _send(self, call: CallState, rank: int, message: Call) -> None:
        try:
            send(self.fds[f"calls{rank}"], message, time.monotonic() + CALL_SEND_WAIT_S)
        except RankGone:
            call.replies.pop(rank, None)  # it will be found dead or stuck

    def _finish(self, call: CallState) -> CallState:
        self._await_replies(call)
        if call.stuck and not call.died:
            self._stop_stuck(call)
        for out in self.output.read_ready(time.monotonic() + 0.5):  # the rest of the output
            self._show(out)
        self._take_replies(call)
        if call.died:
            self._stop_all(call)
        return call

    def _await_replies(self, call: CallState) -> None:
        heartbeat = Heartbeat(self.echo, call.timeout, call.started, lambda: call.pending,
                              enabled=self.config.echo and call.seq > 0)
        self.loop(heartbeat).run(lambda: not call.over, functools.partial(self._check, call))

    def _check(self, call: CallState, now: float) -> float:
        """The run loop's step for a call: replies taken, deaths and the deadline noted."""
        self._take_replies(call)
        call.died = [s.rank for s in self.ranks if s.exit_time is not None]
        if call.died or not call.pending:
            call.over = True
        elif now >= call.ends_at():
            call.stuck, call.over = call.pending, True
        return call.ends_at()

    def _take_replies(self, call: CallState) -> None:
        for rank, reader in enumerate(self.frames):
            for reply in reader.take():
                if reply.seq != call.seq:
                    continue  # a reply to an earlier call that was given up on
                call.replies[rank] = reply
                if reply.status != "ok" and call.first_failure is None:
                    call.first_failure = time.monotonic()

    # -- when it goes wrong -----------------------------------------------------------------
    def _stop_stuck(self, call: CallState) -> None:
        """Stacks first (where each waits), then SIGINT: a rank in Python code replies
        ``interrupted`` and keeps its namespace; one that cannot (inside a collective) is
        left for the caller to restart."""
        call.stacks = self._collect_stacks(call.stuck)
        self._interrupt(call)

    def _on_stop_button(self, call: CallState) -> None:
        """The kernel's interrupt: every rank still in the call gets SIGINT and a moment
        to reply; the call's KeyboardInterrupt is re-raised by the caller."""
        with deferred():
            self._interrupt(call)
            if call.pending and not call.died:  # as a hang: where they wait, then restart
                call.stacks = self._collect_stacks(call.pending)
                self.lost = stuck_report(call.pending, call.stacks)
            elif call.died:
                self.lost = f"rank {call.died[0]} died at the interrupt"

    def _interrupt(self, call: CallState) -> None:
        marked = self.files.interrupted_call.with_suffix(".new")
        marked.write_text(str(call.seq))  # first: the ranks check it when the SIGINT lands
        os.replace(marked, self.files.interrupted_call)
        for rank in call.pending:
            self.server.signal(self.ranks[rank].pid, signal.SIGINT)
        until = time.monotonic() + INTERRUPT_WAIT_S
        while call.pending and time.monotonic() < until and not call.died:
            self.loop().turn(min(time.monotonic() + 0.05, until))
            self._take_replies(call)
            call.died = [s.rank for s in self.ranks if s.exit_time is not None]

    def _stop_all(self, call: CallState) -> None:
        """A rank died: its group is broken for everyone; stop the others now (their
        exits are not failures of their own)."""
        self.lost = (f"rank {call.died[0]} of these live ranks died; the others were "
                     "stopped. ranks.restart() starts new ones.")
        running = [s for s in self.ranks if s.running]
        for state in running:
            state.stopped_by_launcher = True
        self._kill(running)
        self._settle(time.monotonic() + KILL_WAIT_S, lambda: any(s.running for s in self.ranks))

    def dead_rank_failure(self, rank: int):
        """What a rank that died left in its error file (the group's set-up failed), if
        anything (a RankFailure or None)."""
        return read_failure(self.files.error(rank))

    def logs(self) -> list[str]:
        """Each rank's lines of the latest call (all ranks, in rank order)."""
        return [s.lines.text() for s in self.ranks]


def stuck_report(ranks: list[int], stacks: dict[int, str]) -> str:
    """Ranks that SIGINT could not stop, and where each waits (a collective, usually)."""
    from ddp_lab.launch.verdict.stacks import waiting_in
    lines = [f"{describe_ranks(ranks)} did not stop at the interrupt:"]
    for rank in ranks:
        where = waiting_in(stacks[rank])
        lines.append(f"rank {rank} waits" + (f" in {where}:" if where else ":"))
        lines += ["    " + line for line in stacks[rank].splitlines()]
    return "\n".join(lines)
