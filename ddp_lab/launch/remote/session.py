"""Live ranks on several hosts, from the notebook's kernel (the controller): the session
contract (``api.LiveRunSession``: start, call, wait, record, close) kept over one
authenticated connection per host (links.py), each host's agent running its share of the
ranks as a local live session (host_ranks.py).

A call goes to every host with its ranks' bodies; each host ends it as a local call ends
(replies, a failure's grace, a hang's stacks and interrupt, a death) and answers with a
``CallDone`` in global ranks; the output comes as it is printed, tagged with rank and host.
What spans hosts is done here: a failure on one host starts the grace on the others
(``Hurry``), the stop button reaches every host (``Stop``), a lost host counts its ranks
as dead, and a death anywhere stops every host's ranks (a group is all or nothing). The
verdict is the local one (live/outcome.py), on the same fields.
"""

from __future__ import annotations

import queue
import sys
import time

from ddp_lab.launch.deadlines import BOUND_SLACK_S, INTERRUPT_WAIT_S, STACK_WAIT_S
from ddp_lab.launch.errors import HostUnreachable, describe_ranks
from ddp_lab.launch.interrupts import deferred
from ddp_lab.launch.live.frames import Reply
from ddp_lab.launch.live.outcome import call_record
from ddp_lab.launch.live.session import CallState, stuck_report
from ddp_lab.launch.output.echo import make_echo
from ddp_lab.launch.output.heartbeat import Heartbeat
from ddp_lab.launch.rank.failure import RankFailure
from ddp_lab.launch.remote import messages as m
from ddp_lab.launch.remote.links import START_S, LauncherSaid, LinkLost
from ddp_lab.launch.remote.startup import HostsStart
from ddp_lab.launch.verdict.rank_state import RankState
from ddp_lab.launch.verdict.record import RunRecord

STOP_WAIT_S = INTERRUPT_WAIT_S + STACK_WAIT_S + 2.0  # each host interrupts, then stacks


class RemoteSession:
    """``config.placement`` is an ``OnHosts`` (network/placement.py): the hosts, the ranks
    on each, how agents get there and where they call back."""

    def __init__(self, config):
        self.config = config
        self.hosts = config.placement
        self.ranks = RankState.of_run(config)
        self.echo = make_echo(config.echo)
        self.start_up = HostsStart(self.hosts)
        self.inbox: queue.Queue = queue.Queue()
        self.seq = 0
        self.current: CallState | None = None
        self.lost: str | None = None
        self.done_hosts: set[int] = set()
        self.failures: dict[int, RankFailure] = {}  # dead ranks' records, as their host sent
        self.lost_hosts: dict[int, str] = {}  # host index -> why it was lost

    def __enter__(self) -> RemoteSession:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- the contract -----------------------------------------------------------------------
    def start(self) -> None:
        """Every host's agent started and connected, the store opened on the first, every
        host's ranks begun: call 0, which ``wait`` awaits."""
        self.start_up.connect(self.inbox)
        store = self._ask(0, m.OpenStore(self.config.world_size), m.StoreOpen).address
        self.current = CallState(0, list(range(self.config.world_size)), self.config.timeout)
        self.done_hosts = set()
        for index, first in enumerate(self.hosts.first_ranks()):
            self.start_up.links[index].send(m.Begin(
                first, self.hosts.nproc, self.config.world_size, len(self.hosts.names),
                self.config.backend, self.config.timeout, self.config.env, store,
                self.hosts.cwd, tuple(sys.path)))

    def call(self, kind: str, bodies: dict, timeout: float) -> CallState:
        if self.lost:
            raise RuntimeError(self.lost)
        self.seq += 1
        call = self.current = CallState(self.seq, sorted(bodies), timeout)
        self.echo = make_echo(self.config.echo)
        for state in self.ranks:
            state.lines.clear()
        self.done_hosts = set()
        for index, ranks in self._hosts_of(call.targets).items():
            sent = self.start_up.links[index].send(
                m.CallDown(call.seq, kind, {r: bodies[r] for r in ranks}, timeout))
            if not sent:
                self._host_lost(index, "its link closed", call)
        return call

    def wait(self) -> CallState:
        call = self.current
        bound = call.started + call.timeout + BOUND_SLACK_S + STOP_WAIT_S
        if call.seq == 0:  # the hosts' fork servers may still be importing torch
            bound += START_S
        try:
            self._collect(call, bound)
        except KeyboardInterrupt:
            self._on_stop_button(call)
            raise
        finally:
            self.echo.close()
        if call.died:
            self._stop_everywhere(call)
        if self.lost_hosts:
            raise self._unreachable(call)
        return call

    def record(self) -> RunRecord:
        return call_record(self, self.current)

    def close(self) -> None:
        """Every link and launcher closed: each agent exits when its channel closes, and
        takes its fork server and ranks with it (agent.py)."""
        with deferred():
            self.start_up.close()
            self.echo.close()

    # -- what the verdict reads (live/outcome.py) ----------------------------------------
    def logs(self) -> list[str]:
        return [s.lines.text() for s in self.ranks]

    def dead_rank_failure(self, rank: int) -> RankFailure | None:
        return self.failures.get(rank)

    # -- inside --------------------------------------------------------------------------
    def _hosts_of(self, ranks: list[int]) -> dict[int, list[int]]:
        by_host: dict[int, list[int]] = {}
        for rank in ranks:
            by_host.setdefault(rank // self.hosts.nproc, []).append(rank)
        return by_host

    def _involved(self, call: CallState) -> set[int]:
        return set(self._hosts_of(call.targets))

    def _collect(self, call: CallState, bound: float) -> None:
        heartbeat = Heartbeat(self.echo, call.timeout, call.started, lambda: call.pending,
                              enabled=self.config.echo and call.seq > 0)
        while not self._involved(call) <= self.done_hosts:
            now = time.monotonic()
            if now >= bound:
                for index in self._involved(call) - self.done_hosts:
                    self._host_lost(index, "its agent did not answer the call in time", call)
                return
            wake = min(bound, heartbeat.next_at(), self.echo.wake_at(), now + 0.25)
            try:
                self._take(self.inbox.get(timeout=max(0.0, wake - now)), call)
            except queue.Empty:
                pass
            self.echo.tick()
            heartbeat.maybe_beat()

    def _take(self, item, call: CallState) -> None:
        match item:
            case (index, m.Lines(rank=rank, lines=lines, status=status)):
                self.ranks[rank].lines.extend(lines)
                self.echo.show(f"rank {rank} @{self.start_up.name(index)}", lines, status)
            case (index, m.CallDone() as done) if done.seq == call.seq \
                    and index not in self.done_hosts:
                self._merge(index, done, call)
            case (index, m.Failed(what=what)):
                self._host_lost(index, f"its agent failed: {what}", call)
            case LinkLost(host_index=index, why=why):
                self._host_lost(index, why, call)
            case LauncherSaid(host_index=index, line=line):
                self.echo.show(self.start_up.name(index), [line])

    def _merge(self, index: int, done: m.CallDone, call: CallState) -> None:
        """One host's part of the call, into the call and the ranks' states."""
        for rank, reply in done.replies.items():
            call.replies[rank] = _local(reply)
        call.stuck += done.stuck
        call.stacks.update(done.stacks)
        call.died += done.died
        for end in done.ranks:
            state = self.ranks[end.rank]
            state.exitcode, state.exit_time = end.exitcode, m.since(end.exit_age)
            state.stopped_by_launcher = end.stopped_by_launcher
            if end.failure is not None:
                self.failures[end.rank] = RankFailure.from_plain(
                    m.failure_timed(end.failure, m.since))
        if done.lost and "did not stop" in done.lost:
            self.lost = stuck_report(call.pending, call.stacks)
        self.done_hosts.add(index)
        failed_at = m.since(done.first_failure_age)
        if done.died:
            failed_at = time.monotonic()
        if failed_at is not None:
            self._hurry_others(call, failed_at)

    def _hurry_others(self, call: CallState, failed_at: float) -> None:
        """A rank failed on one host: the others' ranks get the grace a local run gives
        (they may wait in a collective for it), then their stacks and an interrupt."""
        if call.first_failure is None or failed_at < call.first_failure:
            call.first_failure = failed_at
        for index in self._involved(call) - self.done_hosts:
            self.start_up.links[index].send(m.Hurry(call.seq, m.age(call.first_failure)))

    def _host_lost(self, index: int, why: str, call: CallState) -> None:
        """Every rank of the host counts as dead (the call's wait raises HostUnreachable)."""
        self.lost_hosts.setdefault(index, why)
        for rank in self.hosts.ranks_of(index):
            state = self.ranks[rank]
            if state.exitcode is None:
                state.exitcode, state.exit_time = -9, time.monotonic()
                if rank not in call.died:
                    call.died.append(rank)
        self.done_hosts.add(index)
        self.start_up.drop(index)
        self._hurry_others(call, time.monotonic())

    def _unreachable(self, call: CallState) -> HostUnreachable:
        """What the call raises when a host was lost: which, why, and what became of all."""
        when = "while the ranks started" if call.seq == 0 else "during the call"
        lines = [f"host {self.start_up.name(index)!r} "
                 f"({describe_ranks(list(self.hosts.ranks_of(index)))}) was lost {when}: {why}"
                 for index, why in sorted(self.lost_hosts.items())]
        lines.append("Its ranks are gone, and the ranks on the other hosts were stopped (a "
                     "process group is all or nothing); live ranks: ranks.restart() starts new "
                     "ones on every host.")
        error = HostUnreachable("\n".join(lines))
        error.logs = self.logs()
        self.lost = str(error)  # every later call says it
        return error

    def _on_stop_button(self, call: CallState) -> None:
        """Ctrl-C in the notebook: every host still in the call interrupts its ranks; a
        rank that does not stop is reported, with its stack, as a hang (the caller
        restarts); then the KeyboardInterrupt goes on."""
        with deferred():
            for index in self._involved(call) - self.done_hosts:
                self.start_up.links[index].send(m.Stop(call.seq))
            self._collect(call, time.monotonic() + STOP_WAIT_S)
            if call.pending and not self.lost:
                self.lost = stuck_report(call.pending, call.stacks)
            elif call.died:
                self._stop_everywhere(call)

    def _stop_everywhere(self, call: CallState) -> None:
        """A rank died: the group is broken for all; every host's ranks are stopped."""
        self.lost = (f"rank {call.died[0]} of these live ranks died; the others were "
                     "stopped. ranks.restart() starts new ones.")
        self.start_up.end_sessions()
        for state in self.ranks:
            if state.exitcode is None:
                state.exitcode, state.exit_time = -9, time.monotonic()
                state.stopped_by_launcher = True

    def _ask(self, index: int, message, answer_type):
        """One question to one host, its answer (the rest that comes meanwhile is shown)."""
        self.start_up.links[index].send(message)
        until = time.monotonic() + self.config.timeout
        while time.monotonic() < until:
            try:
                item = self.inbox.get(timeout=0.25)
            except queue.Empty:
                continue
            if isinstance(item, tuple) and isinstance(item[1], answer_type):
                return item[1]
            if isinstance(item, LinkLost) or (isinstance(item, tuple)
                                              and isinstance(item[1], m.Failed)):
                why = item.why if isinstance(item, LinkLost) else item[1].what
                raise RuntimeError(f"host {self.start_up.name(index)!r}: {why}")
            if isinstance(item, LauncherSaid):
                self.echo.show(self.start_up.name(item.host_index), [item.line])
        raise TimeoutError(f"host {self.start_up.name(index)!r} did not answer "
                           f"{type(message).__name__} within {self.config.timeout:g} s")


def _local(reply: Reply) -> Reply:
    """A reply with its failure's age back as a time of this machine."""
    if reply.status == "ok":
        return reply
    return Reply(reply.seq, reply.rank, reply.status, m.failure_timed(reply.body, m.since))
