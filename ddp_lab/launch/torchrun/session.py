"""``run_script(..., launcher="torchrun")``: the script started by torch's own elastic agent.

The agent is torchrun itself (``ddp_lab.launch.torchrun.agent`` runs ``torch.distributed.run``),
with ``--standalone --nproc-per-node=N`` as you would type it, so the ranks get exactly
torchrun's environment, rendezvous and restarts. Around it, the default launcher's
promises:

- live output as ``[rank N] line``: torchrun tees every worker line to its own output
  behind a prefix we pick (``tee.TeeDemux`` splits it back per rank);
- ``ddp_lab.report(value)`` becomes ``values[rank]``: the agent passes ``DDP_LAB_RUN_DIR``
  on to its workers and ``report`` writes there (without it, report does nothing);
- a failing rank raises ``WorkerError`` naming the root cause: torchrun says which ranks
  failed with which exit code, each rank's log holds its traceback;
- after ``timeout`` seconds, ``WorkerTimeout`` with each stuck rank's Python stack (workers
  run with ``PYTHONFAULTHANDLER=1``, so SIGABRT makes them print it first);
- private: the agent (its store listens on every interface of its network namespace, and
  unpickles the rendezvous state it holds) and its workers run in a network namespace of
  their own with only a loopback (network/isolation.py), which nobody else reaches;
- nothing left: the agent runs in its own session and its workers in theirs (torchrun puts
  each worker in a new session), so cleanup walks the agent's process tree; if this process
  dies, the agent sees its stdin close and stops its workers itself.
"""

from __future__ import annotations

import math
import os
import resource
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

from ddp_lab.launch.config import (RUN_DIR_VAR, LaunchConfig, RunFiles, loopback_env, new_run_dir,
                                   package_pythonpath, rank_limits, threads_per_rank)
from ddp_lab.launch.deadlines import DRAIN_QUIET_S, TORCHRUN_STACK_WAIT_S, Deadline
from ddp_lab.launch.errors import DistributedRunError
from ddp_lab.launch.forkserver.process_tree import (kill_tree, send, send_to_main_thread,
                                                      wait_gone)
from ddp_lab.launch.interrupts import deferred
from ddp_lab.launch.output.echo import make_echo
from ddp_lab.launch.output.heartbeat import Heartbeat
from ddp_lab.launch.output.reader import Output, OutputReader
from ddp_lab.launch.output.run_loop import RunLoop
from ddp_lab.launch.rank.failure import RankFailure
from ddp_lab.launch.rank.limits import apply_limits
from ddp_lab.launch.torchrun.agent import FAILURES_FILE
from ddp_lab.launch.torchrun.failures import read_agent_failures
from ddp_lab.launch.torchrun.tee import PREFIX_TEMPLATE, TeeDemux, last_failure
from ddp_lab.launch.verdict.rank_state import RankState
from ddp_lab.launch.verdict.record import RunRecord

STOPPED_BY_AGENT = (-signal.SIGTERM, -signal.SIGKILL)  # how torchrun stops a worker's peers


def torchrun_args(config: LaunchConfig, log_dir: str) -> list[str]:
    """The torchrun command line (without the leading ``torchrun``) for this run."""
    return ["--standalone", f"--nproc-per-node={config.world_size}", "--tee=3",
            f"--log-dir={log_dir}", config.script, *config.script_args]


def agent_env(config: LaunchConfig, run_dir: str) -> dict[str, str]:
    """The agent's environment, which torchrun passes on to every worker."""
    env = loopback_env(config)
    if "OMP_NUM_THREADS" not in config.env:  # the caller's env= may set it
        env["OMP_NUM_THREADS"] = str(threads_per_rank(config.world_size))
    env.update({RUN_DIR_VAR: run_dir, "PYTHONUNBUFFERED": "1", "PYTHONFAULTHANDLER": "1",
                "TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE": PREFIX_TEMPLATE,
                "PYTHONPATH": package_pythonpath(env)})
    return env


class TorchrunSession:
    """``api.drive(TorchrunSession(config))``: the session contract (``api.RunSession``:
    start, wait, record, close) on torchrun's agent; ``__enter__`` creates nothing, ``start``
    registers each thing it makes for ``close`` with Ctrl-C held back in between."""

    def __init__(self, config: LaunchConfig):
        self.config = config
        self.ranks = RankState.of_run(config)
        self.agent_lines: list[str] = []  # the agent's own (unprefixed) output
        self.output: OutputReader | None = None  # set by start, as the three below
        self.echo = make_echo(config.echo)
        self.timed_out = False
        self.stacks: dict[int, str] = {}
        self.failures: dict[int, RankFailure] = {}  # read from the ranks' logs by _settle
        self.seconds = 0.0
        self.agent: subprocess.Popen | None = None
        self.run_dir = self.files = self.log_dir = None
        self.started: float | None = None  # set by start
        self.ends_at = math.inf  # the deadline, then the end of reading what the killed printed
        self.drained = False

    def __enter__(self) -> "TorchrunSession":
        return self  # creates nothing: once the with-block is entered, close will run

    def start(self) -> None:
        from ddp_lab.launch.network.isolation import prefix
        with deferred():
            self.run_dir = new_run_dir()
        self.files = RunFiles(self.run_dir)
        self.log_dir = os.path.join(self.run_dir, "torchrun")
        with deferred():
            self.output = OutputReader()
        command = [*prefix(wildcard=True), sys.executable, "-m",
                   "ddp_lab.launch.torchrun.agent", *torchrun_args(self.config, self.log_dir)]
        self.started = time.monotonic()
        env = agent_env(self.config, self.run_dir)
        with deferred():
            self.agent = subprocess.Popen(command, stdin=subprocess.PIPE,
                                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                          start_new_session=True, env=env)
        if hasattr(resource, "prlimit"):  # Linux: no core files when a stuck worker is
            resource.prlimit(self.agent.pid, resource.RLIMIT_CORE, (0, 0))  # sent SIGABRT
            # before the agent (importing torch for seconds) starts a worker, who inherits them
            apply_limits(rank_limits(env), pid=self.agent.pid)
        self.output.add(self.agent.stdout, route=TeeDemux().feed)

    # -- the run ------------------------------------------------------------------------
    def wait(self) -> None:
        # torchrun stops a failed rank's peers itself: no grace of ours
        self.ends_at = Deadline(self.started, self.config.timeout, grace=None).ends_at()
        heartbeat = Heartbeat(self.echo, self.config.timeout, self.started,
                              lambda: list(range(self.config.world_size)),
                              enabled=self.config.echo)
        loop = RunLoop(self.output, self.echo, self._take, heartbeat=heartbeat)
        loop.run(lambda: self.output.open and not self.drained, self._step)
        for out in self.output.flush():  # last lines without their newline
            self._take(out)
        try:
            self.agent.wait(timeout=max(1.0, self.ends_at - time.monotonic()))
        except subprocess.TimeoutExpired:  # its output closed, yet it does not exit
            self._time_out()
            self.agent.wait()
        self.seconds = time.monotonic() - self.started
        self._settle()

    def _step(self, now: float) -> float:
        """At the deadline: stacks, then stop the agent; then read what the killed ones
        printed for DRAIN_QUIET_S more, and stop reading."""
        if now < self.ends_at:
            return self.ends_at
        if self.timed_out:
            self.drained = True
            return now
        self._time_out()
        self.ends_at = time.monotonic() + DRAIN_QUIET_S
        return self.ends_at

    def _take(self, out: Output) -> None:
        if out.owner is None:
            self.agent_lines.extend(out.lines)
            self.echo.show("torchrun", out.lines)
            return
        state = self.ranks[out.owner]
        state.exit_time = time.monotonic()  # last sign of life, for the root cause order
        state.lines.extend(out.lines)
        self.echo.show(out.owner, out.lines, out.status)

    def _time_out(self) -> None:
        """Ask every stuck worker for its stack (SIGABRT + faulthandler), then stop all.
        The agent is frozen first: once one worker dies of the SIGABRT, torchrun stops the
        others with SIGTERM, which cut a slower worker's dump after its first thread.
        The workers are frozen too, and each SIGABRT put on a worker's main thread before
        any is let go: a worker that dies closes its sockets, and a peer not yet in its
        handler (this process preempted between two signals on a busy machine, or the
        handler run by another thread) left its collective with "Connection closed by
        peer" and was dumped from the interpreter's exit (seen under load: rank 1's stack
        one thread with no Python frame, all_reduce lost, 4 of 70 runs at four busy
        loops). Frozen with the signal pending on it, the main thread runs the handler
        before anything else and its stack stays in the collective (0 of 50)."""
        self.timed_out = True
        send(self.agent.pid, signal.SIGSTOP)  # kill_tree below ends it (SIGKILL)
        workers = _workers_by_rank(self.agent.pid)
        for sig, sender in ((signal.SIGSTOP, send), (signal.SIGABRT, send_to_main_thread),
                            (signal.SIGCONT, send)):
            for pid in workers.values():
                sender(pid, sig)
        wait_gone(list(workers.values()), TORCHRUN_STACK_WAIT_S)
        self.stacks = {rank: self._stack_of(rank) for rank in sorted(workers)} or {
            rank: "(torchrun had not started the workers yet)"
            for rank in range(self.config.world_size)}
        kill_tree(self.agent.pid)

    def _stack_of(self, rank: int) -> str:
        from ddp_lab.launch.verdict.stacks import format_dump
        # torchrun's log folders are named by local rank, which is the rank on one node
        logs = sorted(Path(self.log_dir).glob(f"*/attempt_*/{rank}/stderr.log"),
                      key=lambda p: p.stat().st_mtime)
        text = logs[-1].read_text(errors="replace") if logs else ""
        dump = text.rpartition("Fatal Python error")[2]
        return format_dump(dump) or "(the rank did not answer with a stack)"

    # -- what happened ------------------------------------------------------------------
    def _settle(self) -> None:
        """Give every rank the exit code torchrun reported (0 when it reported none) and,
        for a failed rank, the failure record the default launcher's ranks write (read
        from its log, held for ``record``)."""
        failures = self._failures()
        if self.agent.returncode != 0 and not failures and not self.timed_out:
            raise DistributedRunError(
                f"torchrun's agent failed before the ranks finished (exit code "
                f"{self.agent.returncode}):\n" + "\n".join(self.agent_lines[-20:]))
        for state in self.ranks:
            failure = failures.get(state.rank)
            state.exitcode = failure.exitcode if failure else 0
            state.exit_time = state.exit_time or time.monotonic()
            state.stopped_by_launcher = state.exitcode in STOPPED_BY_AGENT
            record = last_failure("\n".join(state.lines), state.exit_time) if failure else None
            if record:
                self.failures[state.rank] = record

    def _failures(self) -> dict:
        return read_agent_failures(Path(self.run_dir, FAILURES_FILE))

    def record(self) -> RunRecord:
        return RunRecord(self.config, tuple(s.record() for s in self.ranks), self.files,
                         self.seconds, self.timed_out, dict(self.stacks),
                         failures=dict(self.failures))

    # -- cleanup ------------------------------------------------------------------------
    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        """The agent's process tree killed, its pipes closed, the run folder removed."""
        with deferred():  # a second Ctrl-C must not cut cleanup short; it is raised after
            try:
                if self.agent is not None:
                    if self.agent.poll() is None:
                        kill_tree(self.agent.pid)
                    self.agent.wait()
                    self.agent.stdin.close()
                    self.agent.stdout.close()
            finally:
                if self.output is not None:
                    self.output.close()
                self.echo.close()
                if self.run_dir is not None:
                    shutil.rmtree(self.run_dir, ignore_errors=True)


def _workers_by_rank(agent_pid: int) -> dict[int, int]:
    """Global rank -> pid of the agent's live workers (read from their environment)."""
    import psutil
    workers = {}
    try:
        children = psutil.Process(agent_pid).children()
    except psutil.NoSuchProcess:
        return workers
    for child in children:
        try:
            workers[int(child.environ()["RANK"])] = child.pid
        except (psutil.Error, KeyError, ValueError):
            pass
    return workers
