"""One run's machinery: a private folder, a rendezvous in a private network, N ranks, their
output, their deadline, and a cleanup that leaves nothing behind whatever happened.

Interrupt-safe by construction: ``__enter__`` creates nothing, so from the moment a
Session exists its ``__exit__`` runs; every resource is registered for cleanup the moment
it is created, with Ctrl-C held back in between (interrupts.py); cleanup holds Ctrl-C back
until it is done and then raises it. The call is bounded whatever the ranks or the fork
server do: it ends within ``timeout`` + ``deadlines.BOUND_SLACK_S`` (a server that stops
answering is killed with its ranks, and the run raises ``ForkServerUnresponsive``).

It keeps the session contract (``api.RunSession``, run by ``api.drive``). A live session
(live/session.py) changes what ``rank_pipes`` and the public ``start``, ``wait``, ``record`` do.
"""

from __future__ import annotations

import contextlib
import functools
import math
import os
import queue
import shutil
import signal
import time
from collections.abc import Callable

from ddp_lab.launch.config import LaunchConfig, RunFiles, new_run_dir, rank_spec, run_env
from ddp_lab.launch.deadlines import (DRAIN_QUIET_S, END_WAIT_S, GRACE_OVER, KILL_WAIT_S, TIMED_OUT,
                                      Deadline, StartClock)
from ddp_lab.launch.errors import ForkServerUnresponsive
from ddp_lab.launch.forkserver.client import ForkServerDied, fork_server_for
from ddp_lab.launch.forkserver.protocol import Exited, NetReady, RunEnded, ServerDied, Spawned
from ddp_lab.launch.interrupts import deferred
from ddp_lab.launch.output.echo import make_echo
from ddp_lab.launch.output.heartbeat import Heartbeat
from ddp_lab.launch.output.reader import Output, OutputReader
from ddp_lab.launch.output.run_loop import RunLoop
from ddp_lab.launch.verdict.rank_state import RankState
from ddp_lab.launch.verdict.record import RunRecord
from ddp_lab.launch.verdict.timeouts import stacks_at_timeout


class Session:
    """``api.drive(Session(config, payload))``: start, wait, record, close (``__exit__``).

    Its phases, each with what it sets: set-up (``run_dir``, ``files``, ``output``, the
    lifeline in ``fds``, ``server``, ``clock``, ``net_reply``, ``base_env``), start (each rank's
    pid in ``ranks``, then ``deadline``), the run (``killed``, ``timed_out``, ``stacks``,
    ``seconds``), cleanup (``run_ended``). Every attribute is set here, None until then.
    ``rank_pipes(rank)``: a rank's extra pipes (made with Ctrl-C held back, own ends kept by
    ``own_fd``); returns the rank's ends, passed after output and lifeline, then closed.
    ``echo_to()``: a new echo (default: the cell's; an agent's: to its controller)."""

    def __init__(self, config: LaunchConfig, payload: bytes | None, called: float | None = None,
                 *, rank_pipes: Callable[[int], list[int]] | None = None,
                 echo_to: Callable[[], object] | None = None):
        self.config = config
        self.payload = payload
        self.rank_pipes = rank_pipes
        self.ranks = RankState.of_run(config)
        self.events: queue.Queue = queue.Queue()  # the fork server's answers (protocol.py)
        self.new_echo = echo_to or functools.partial(make_echo, config.echo)
        self.echo = self.new_echo()
        self._cleanup = contextlib.ExitStack()
        self.run_dir = self.files = self.output = self.server = self.clock = None  # _set_up
        self.base_env = self.net_reply = None
        self.fds: dict[str, int] = {}  # closed once, by name: a number may be reused at once
        self.requested = 0  # spawn requests sent (ranks[:requested] have a pid, or will)
        self.deadline: Deadline | None = None
        self.killed: set[int] = set()  # pids sent SIGKILL: only their exits are awaited,
        self.kill_sent_at = math.inf  # and a server silent KILL_WAIT_S after it is wedged
        self.timed_out = False
        self.stacks: dict[int, str] = {}
        self.stacks_at_failure: dict[int, str] | None = None  # taken once: verdict/timeouts.py
        self.called = time.monotonic() if called is None else called  # res.seconds from here
        self.seconds = 0.0
        self.run_ended = False

    def __enter__(self) -> "Session":
        return self  # creates nothing: once the with-block is entered, __exit__ will run

    # -- set-up -------------------------------------------------------------------------
    def start(self) -> None:
        self._set_up()
        for state in self.ranks:
            self._spawn(state)
        self._await(lambda: any(s.pid is None for s in self.ranks), "while starting the ranks")
        self.deadline = self.clock.deadline(started=time.monotonic())

    def _set_up(self) -> None:
        keep = self._cleanup.callback
        with deferred():
            self.run_dir = new_run_dir()
            keep(shutil.rmtree, self.run_dir, ignore_errors=True)
        self.files = RunFiles(self.run_dir)
        if self.payload is not None:
            self.files.payload.write_bytes(self.payload)
        with deferred():
            self.output = OutputReader()
            keep(self.output.close)
        with deferred():  # the lifeline: ranks die when its write end closes (rank/main.py)
            for name, fd in zip(("lifeline_r", "lifeline_w"), os.pipe()):
                self.own_fd(name, fd)
        self._set_up_network()

    def _set_up_network(self) -> None:
        """The placement's store (on the first host), or the fork server's (isolation.py)."""
        placement = self.config.placement
        self.server = fork_server_for(placement)
        self._cleanup.callback(self.server.forget_run, self.run_dir)
        self.server.wait_ready()  # a new one imports torch first: not the run's time
        self.clock = StartClock(entered=time.monotonic(), timeout=self.config.timeout)
        host, port = placement.store or self._hosted_store(placement)
        self.base_env = run_env(self.config, port, self.run_dir, address=host)

    def _hosted_store(self, placement) -> tuple[str, int]:
        """Opened by the fork server after what the placement plans (a shaped run's links)."""
        plan = placement.link_plan(self.config.world_size)
        self.server.net_up(self.run_dir, self.config.world_size, plan, self.events)
        self._await(lambda: self.net_reply is None, "while setting up the run's rendezvous")
        if self.net_reply.error:
            raise placement.not_built(self.net_reply.error)
        return self.net_reply.address

    def _spawn(self, state: RankState) -> None:
        spec = rank_spec(self.config, state.rank, self.run_dir, self.base_env)
        with deferred():  # the request is sent and counted, or neither
            out_r, out_w = os.pipe()
            extra: list[int] = []
            try:
                self.output.add(out_r, owner=state.rank)
                extra = self.rank_pipes(state.rank) if self.rank_pipes else []
                self.server.spawn(spec, [out_w, self.fds["lifeline_r"], *extra], self.events)
                self.requested += 1
            finally:
                for fd in (out_w, *extra):
                    os.close(fd)

    def own_fd(self, name: str, fd: int) -> None:
        """Hold ``fd`` under ``name`` until cleanup closes it (by name: see ``fds``)."""
        self.fds[name] = fd
        self._cleanup.callback(self._close, name)

    def _await(self, pending, when: str) -> None:
        """Handle the fork server's replies until ``pending()`` is false."""
        until = self.clock.setup_until
        while pending():
            if not self.server.alive and not self.server.wedged:
                raise RuntimeError(f"the ddp_lab fork server died {when}; run again (a new "
                                   "one is started)")
            if time.monotonic() >= until or self.server.wedged:
                self._abandon_server(when)
            self._drain_events(block_s=min(0.25, max(0.0, until - time.monotonic())))

    # -- the run ------------------------------------------------------------------------
    def wait(self) -> None:
        """Stream output until every rank has exited, enforcing grace and deadline."""
        heartbeat = Heartbeat(self.echo, self.config.timeout, self.deadline.started,
                              lambda: [s.rank for s in self.ranks if s.running],
                              enabled=self.config.echo)
        self.loop(heartbeat).run(lambda: any(s.running for s in self.ranks), self._enforce)
        # all they printed is in the pipes, maybe unread: res.logs must keep their tails
        for out in self.output.read_to_the_end(DRAIN_QUIET_S, self.clock.limit):
            self._show(out)
        self.seconds = time.monotonic() - self.called

    def loop(self, heartbeat=None) -> RunLoop:
        """The run loop over the ranks' output, the fork server's answers between reads."""
        return RunLoop(self.output, self.echo, self._show, self._drain_events, heartbeat)

    def _enforce(self, now: float) -> float:
        """Do what the deadline policy says is due now; when to look again."""
        running = [s for s in self.ranks if s.running]
        if self.server.wedged or now >= self.kill_sent_at + KILL_WAIT_S:
            self._abandon_server("during the run")
        if not running or self.killed:
            return now + 0.05  # only exit reports are still to come
        first = min((s.exit_time for s in self.ranks if s.exitcode not in (None, 0)),
                    default=None)
        if first is not None and self.stacks_at_failure is None:  # once: verdict/timeouts.py
            self.stacks_at_failure = stacks_at_timeout(self.files, self.ranks, self._collect_stacks)
        due = self.deadline.due(now, first)
        if due == GRACE_OVER:
            for state in running:
                state.stopped_by_launcher = True
            self._kill(running)
        elif due == TIMED_OUT:
            self.timed_out = True
            self.stacks = self._collect_stacks([s.rank for s in running])
            self._kill(running)
        return now + 0.05 if self.killed else self.deadline.ends_at(first)

    def _kill(self, states: list[RankState]) -> None:
        self.kill_sent_at = min(self.kill_sent_at, time.monotonic())
        for state in states:
            if state.pid not in self.killed:
                self.killed.add(state.pid)
                self.server.signal(state.pid, signal.SIGKILL)

    def _show(self, out: Output) -> None:
        self.ranks[out.owner].lines.extend(out.lines)
        self.echo.show(out.owner, out.lines, out.status)

    def _drain_events(self, block_s: float) -> None:
        try:
            event = self.events.get(timeout=block_s) if block_s else self.events.get_nowait()
            while True:
                self._on_event(event)
                event = self.events.get_nowait()
        except queue.Empty:
            pass

    def _on_event(self, event) -> None:
        """The one dispatch of the fork server's answers (protocol.py)."""
        match event:
            case Spawned(rank=rank, pid=pid):
                self.ranks[rank].pid = pid
            case Exited(pid=pid, exitcode=exitcode):
                state = {s.pid: s for s in self.ranks}[pid]
                state.exitcode, state.exit_time = exitcode, time.monotonic()
            case ServerDied():
                self._all_exited()
            case RunEnded():
                self.run_ended = True
            case NetReady():
                self.net_reply = event

    def _all_exited(self) -> None:
        for state in (s for s in self.ranks if s.exit_time is None):
            state.exit_time = time.monotonic()

    def _collect_stacks(self, ranks: list[int]) -> dict[int, str]:
        """Each rank's stack now: a rank's file keeps every dump, read from its end now."""
        from ddp_lab.launch.verdict.stacks import collect_stacks
        offsets = {r: path.stat().st_size for r in ranks if (path := self.files.stack(r)).exists()}
        return collect_stacks(self.server, {r: self.ranks[r].pid for r in ranks}, self.files,
                              offsets)

    def _abandon_server(self, when: str) -> None:
        """The fork server stopped answering: kill it with its ranks and say so."""
        pid = self.server.process.pid
        self.server.kill()
        self._all_exited()
        raise ForkServerUnresponsive(
            f"the ddp_lab fork server (pid {pid}) stopped answering {when} (was it stopped "
            "with SIGSTOP, or wedged?). It was killed with every rank of this run; run "
            "again and a new one is started.")

    # -- cleanup ------------------------------------------------------------------------
    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        """Stop every rank, remove everything of the run (once: ``__exit__`` does)."""
        with deferred():  # a second Ctrl-C must not cut cleanup short; it is raised after
            try:
                self._stop_ranks()
            finally:
                self._cleanup.close()
                self.echo.close()

    def _stop_ranks(self) -> None:
        """Kill what still runs (also ranks whose spawn reply is still on its way), then
        wait for the server to report them and their leftovers gone; kill it if it won't."""
        if self.server is None:
            return
        self._close("lifeline_w")  # a rank we do not know of yet (reply in flight) dies too
        with contextlib.suppress(ForkServerUnresponsive, ForkServerDied):
            if self.server.wedged:
                self._abandon_server("during the run")
            self._settle(time.monotonic() + KILL_WAIT_S, self._unsettled)
            if self.server.alive:
                self.server.end_run(self.run_dir, self.events)
                self._settle(time.monotonic() + END_WAIT_S,
                             lambda: not self.run_ended and self.server.alive)

    def _unsettled(self) -> bool:
        unanswered = any(s.pid is None for s in self.ranks[:self.requested])
        running = [s for s in self.ranks if s.running]
        self._kill(running)
        return (unanswered or bool(running)) and self.server.alive

    def _settle(self, until: float, pending) -> None:
        while pending():
            if time.monotonic() >= until or self.server.wedged:
                self._abandon_server("while the run was cleaned up")
            self._drain_events(block_s=0.05)

    def _close(self, *names: str) -> None:
        for name in names:
            fd = self.fds.pop(name, None)
            if fd is not None:
                os.close(fd)

    def record(self) -> RunRecord:
        """The finished run, for ``outcome.conclude`` (call before leaving the ``with``:
        the results are in the run folder, which cleanup removes)."""
        return RunRecord(self.config, tuple(s.record() for s in self.ranks), self.files,
                         self.seconds, self.timed_out, dict(self.stacks),
                         dict(self.stacks_at_failure or {}))
