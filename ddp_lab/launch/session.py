"""One run's machinery: a private folder, a loopback rendezvous, N ranks, their output,
their deadline, and a cleanup that leaves nothing behind whatever happened.

The rendezvous store lives here in the launcher (as torchrun's agent hosts it), on a socket
bound to 127.0.0.1 that we open ourselves, so the port is ours from the start (no race with
another run) and nobody on the network can join. Ranks reach it as ``env://`` clients
(TORCHELASTIC_USE_AGENT_STORE), so worker scripts run unchanged under torchrun.
"""

from __future__ import annotations

import os
import queue
import shutil
import signal
import socket
import sys
import tempfile
import time

from ddp_lab.launch.config import LaunchConfig, RankSpec, RunFiles
from ddp_lab.launch.echo import make_echo
from ddp_lab.launch.environment import rank_env, run_env, threads_per_rank
from ddp_lab.launch.output import Output, OutputReader
from ddp_lab.launch.ranks import RankState
from ddp_lab.launch.record import RunRecord
from ddp_lab.launch.spawner import get_fork_server

FAILURE_GRACE_S = 2.0   # after a rank fails, peers get this long to fail on their own
STACK_WAIT_S = 2.0      # how long to wait for stuck ranks to write their stacks
EXIT_WAIT_S = 10.0      # how long cleanup waits for killed ranks to be reaped


class Session:
    """Use as ``with Session(config, payload) as s: s.start(); s.wait()``."""

    def __init__(self, config: LaunchConfig, payload: bytes | None):
        self.config = config
        self.payload = payload
        self.ranks = [RankState(r) for r in range(config.world_size)]
        self.events: queue.Queue = queue.Queue()
        self.output = OutputReader()
        self.timed_out = False
        self.stacks: dict[int, str] = {}
        self.killing = False  # ranks were sent SIGKILL; only their exit reports are awaited
        self.echo = make_echo(config.echo)
        self.seconds = 0.0

    # -- set-up -------------------------------------------------------------------------
    def __enter__(self) -> "Session":
        # mkdtemp makes it 0700; the pid says whose it is
        self.run_dir = tempfile.mkdtemp(prefix=f"ddp_lab-{os.getpid()}-")
        self.files = RunFiles(self.run_dir)
        if self.payload is not None:
            self.files.payload.write_bytes(self.payload)
        self.lifeline_r, self.lifeline_w = os.pipe()
        self.server = get_fork_server()
        self.store, self.port = _loopback_store(self.config.world_size)
        self.base_env = run_env(self.config, self.port, self.run_dir)
        return self

    def start(self) -> None:
        for state in self.ranks:
            self._spawn(state)
        self._await_spawned()
        self.started = time.monotonic()

    def _spawn(self, state: RankState) -> None:
        out_r, out_w = os.pipe()
        self.output.add(out_r, owner=state.rank)
        try:
            self.server.spawn(self._spec(state.rank), [out_w, self.lifeline_r], self.events)
        finally:
            os.close(out_w)

    def _spec(self, rank: int) -> RankSpec:
        c = self.config
        return RankSpec(rank=rank, world_size=c.world_size, run_dir=self.run_dir,
                        env=rank_env(self.base_env, rank), cwd=os.getcwd(),
                        sys_path=tuple(sys.path), backend=c.backend,
                        threads=threads_per_rank(c.world_size),
                        pg_timeout_s=c.timeout + 60.0, script=c.script,
                        script_args=c.script_args)

    def _await_spawned(self) -> None:
        from ddp_lab.launch.spawner import SPAWN_REPLY_TIMEOUT
        for state in self.ranks:
            event = self.events.get(timeout=SPAWN_REPLY_TIMEOUT)
            if event[0] != "spawned":
                raise RuntimeError("the ddp_lab fork server died while starting ranks; "
                                   "run again (a new one is started)")
            state.pid = event[1]

    # -- the run ------------------------------------------------------------------------
    def wait(self) -> None:
        """Stream output until every rank has exited, enforcing grace and deadline."""
        from ddp_lab.launch.heartbeat import Heartbeat
        heartbeat = Heartbeat(self.config.timeout, enabled=self.config.echo)
        deadline = self.started + self.config.timeout
        while any(s.exit_time is None for s in self.ranks):
            now = time.monotonic()
            self._enforce(now, deadline)
            if self.killing:
                wakeup = now + 0.05
            else:
                wakeup = min(deadline, self._grace_end(), heartbeat.next_at(self.started))
            self._pump(max(0.0, wakeup - now))
            heartbeat.maybe_beat(self.started, [s.rank for s in self.ranks if s.running])
        self.seconds = time.monotonic() - self.started

    def _enforce(self, now: float, deadline: float) -> None:
        running = [s for s in self.ranks if s.running]
        if not running or self.killing:
            return
        if now >= self._grace_end():
            for state in running:
                state.stopped_by_launcher = True
            self._kill(running)
        elif now >= deadline and self._first_failure() is None:
            self.timed_out = True
            self.stacks = self._collect_stacks([s.rank for s in running])
            self._kill(running)

    def _kill(self, states: list[RankState]) -> None:
        self.killing = True
        for state in states:
            self.server.signal(state.pid, signal.SIGKILL)

    def _first_failure(self) -> float | None:
        times = [s.exit_time for s in self.ranks if s.exitcode not in (None, 0)]
        return min(times) if times else None

    def _grace_end(self) -> float:
        first = self._first_failure()
        return float("inf") if first is None else first + FAILURE_GRACE_S

    def _pump(self, timeout: float) -> None:
        """Wait for output or an exit, whichever comes first, and handle what came."""
        if self.output.open:
            # capped: an exit report does not wake select (a grandchild may hold the pipe)
            for out in self.output.read(time.monotonic() + min(timeout, 0.25)):
                self._show(out)
            self._drain_events(block_s=0.0)
        else:  # every pipe is closed: only exit reports are still to come
            self._drain_events(block_s=min(timeout, 3600.0))

    def _show(self, out: Output) -> None:
        self.ranks[out.owner].lines.extend(out.lines)
        self.echo.show(out.owner, out.lines, out.status)

    def _drain_events(self, block_s: float) -> None:
        by_pid = {s.pid: s for s in self.ranks}
        try:
            event = self.events.get(timeout=block_s) if block_s else self.events.get_nowait()
            while True:
                self._on_event(event, by_pid)
                event = self.events.get_nowait()
        except queue.Empty:
            pass

    def _on_event(self, event: tuple, by_pid: dict) -> None:
        if event[0] == "exited":
            state = by_pid[event[1]]
            state.exitcode, state.exit_time = event[2], time.monotonic()
        elif event[0] == "server-died":
            for state in self.ranks:
                if state.exit_time is None:
                    state.exit_time = time.monotonic()

    def _collect_stacks(self, ranks: list[int]) -> dict[int, str]:
        from ddp_lab.launch.stacks import read_stack_dump
        for rank in ranks:
            self.server.signal(self.ranks[rank].pid, signal.SIGUSR1)
        until = time.monotonic() + STACK_WAIT_S
        stacks = {}
        for rank in ranks:
            stacks[rank] = read_stack_dump(self.files.stack(rank), until)
        return stacks

    # -- cleanup ------------------------------------------------------------------------
    def __exit__(self, *exc) -> None:
        try:
            self._stop_ranks()
        finally:
            self._release()
            self.echo.close()

    def _stop_ranks(self) -> None:
        for state in self.ranks:
            if state.running:
                self.server.signal(state.pid, signal.SIGKILL)
        os.close(self.lifeline_w)  # any rank that is left kills itself
        self.lifeline_w = None
        until = time.monotonic() + EXIT_WAIT_S
        while any(s.running for s in self.ranks) and time.monotonic() < until:
            self._pump(0.05)

    def _release(self) -> None:
        self.output.close()
        for fd in (self.lifeline_r, self.lifeline_w):
            if fd is not None:
                os.close(fd)
        self.store = None  # its destructor stops the server thread and closes the socket
        shutil.rmtree(self.run_dir, ignore_errors=True)

    def record(self) -> RunRecord:
        """The finished run, for ``outcome.conclude`` (call before leaving the ``with``:
        the results are in the run folder, which cleanup removes)."""
        return RunRecord(self.config, tuple(s.record() for s in self.ranks), self.files,
                         self.seconds, self.timed_out, dict(self.stacks))


def _loopback_store(world_size: int):
    """A TCPStore server on a socket we bound to 127.0.0.1 ourselves (never 0.0.0.0)."""
    from torch.distributed import TCPStore
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        listener.bind(("127.0.0.1", 0))
        listener.listen(max(128, world_size))
        port = listener.getsockname()[1]
        store = TCPStore("127.0.0.1", port, world_size, is_master=True,
                         wait_for_workers=False, master_listen_fd=listener.fileno())
    except BaseException:
        listener.close()
        raise
    listener.detach()  # the store owns and closes the descriptor now
    return store, port
