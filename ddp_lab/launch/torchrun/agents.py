"""Start torchrun agents from a notebook, one per host, as you would type them on real
machines, and get back what they printed and what their workers reported.

Each agent is a real ``python -m torch.distributed.run ...`` process started on its host
(``ip netns exec`` for a namespace), in a session of its own. Its output streams live as
``[node0] ...``. Two additions to the command you see, both in its environment: torchrun's
log folder (``PET_LOG_DIR``, the variable behind ``--log-dir``) is in a private folder
(otherwise torchrun leaves a ``/tmp/torchelastic_*`` folder behind after every run), and
``DDP_LAB_RUN_DIR`` names the same folder, so that ``ddp_lab.report(value)`` in a worker
lands there (the namespaces share this machine's disk). At the deadline, on an exception or
on the stop button, every agent and every worker is killed and the folder removed.

torchrun's agent starts every worker in a session of its own (``start_new_session=True`` in
torch.distributed.elastic's SubprocessHandler), so killing the agent's process group would
miss them: ``process_tree.kill_tree`` freezes the agent, lists its whole tree, kills it all.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from ddp_lab.launch.config import (LOG_LIMIT_BYTES, RUN_DIR_VAR, RunFiles, new_run_dir,
                                   package_pythonpath)
from ddp_lab.launch.deadlines import AGENTS_DRAIN_S, Deadline
from ddp_lab.launch.forkserver.process_tree import kill_tree
from ddp_lab.launch.network.isolation import PrivateNetwork
from ddp_lab.launch.output.echo import make_echo
from ddp_lab.launch.output.kept_log import KeptLog
from ddp_lab.launch.output.reader import Output, OutputReader
from ddp_lab.launch.output.run_loop import RunLoop

# Not echoed (kept in the outputs): C++ stack frames under a torch warning, and a warning
# gVisor-style sandboxes trigger on every store connection (they report socket addresses
# no resolver knows); neither helps a reader of the notebook.
_NOT_ECHOED = re.compile(r"^(frame #\d+: |<omitting python frames>|Exception raised from |"
                         r"\[W[^\]]*\] \[c10d\] The hostname of the client socket cannot)")
_ERROR_LINE = re.compile(r"^(?:\[rank\d+\]: )?((?:[\w]+\.)*\w*(?:Error|Exception)): (.+)$")


class Host(Protocol):
    """Where an agent runs: ``ddp_lab.course.netns.Host`` (a network namespace or this
    machine) is one; ``ThisMachine`` is the plain one. ``netns`` None: this machine's
    network, which the runner replaces by a private one (network/isolation.py)."""

    name: str
    netns: str | None

    def command(self, argv: Sequence[str]) -> list[str]: ...


@dataclass(frozen=True)
class ThisMachine:
    name: str = "localhost"
    netns: str | None = None

    def command(self, argv: Sequence[str]) -> list[str]:
        return list(argv)


@dataclass(frozen=True)
class Agent:
    """One ``torchrun ARGS`` on one host, with extra environment variables; with
    ``start_when``, it starts only once that text appeared in the output so far.
    ``module`` is the launcher (``torch.distributed.launch`` for the legacy one)."""

    host: Host
    args: tuple[str, ...]
    env: Mapping[str, str] = field(default_factory=dict)
    start_when: str | None = None
    module: str = "torch.distributed.run"

    def argv(self) -> list[str]:
        return [sys.executable, "-m", self.module, *self.args]

    def command_line(self) -> str:
        env = " ".join(f"{k}={shlex.quote(v)}" for k, v in self.env.items())
        where = f"{self.host.name}$ "
        launcher = "torchrun" if self.module == "torch.distributed.run" else \
            f"python -m {self.module}"
        return f"{where}{env + ' ' if env else ''}{launcher} {shlex.join(self.args)}"


@dataclass(frozen=True)
class AgentsResult:
    """``returncodes[i]`` is None for an agent we stopped (or that never started);
    ``values`` maps each global rank to what its worker reported (last report wins);
    ``stopped`` lists the pids we had to kill at the end (each agent, then its tree)."""

    labels: list[str]
    returncodes: list[int | None]
    outputs: list[list[str]]
    values: dict
    seconds: float
    stopped: tuple[int, ...] = ()

    @property
    def ok(self) -> bool:
        return all(code == 0 for code in self.returncodes)

    def errors(self, node: int) -> list[str]:
        """The distinct exception lines in a node's output (``Type: message``)."""
        seen: dict[str, None] = {}
        for line in self.outputs[node]:
            match = _ERROR_LINE.match(line)
            if match and match[1] != "ChildFailedError":
                seen.setdefault(f"{match[1].rsplit('.', 1)[-1]}: {match[2][:240]}")
        return list(seen)

    def summary(self, keep: tuple[str, ...] = ()) -> str:
        """Per node: how its agent ended, the lines starting with one of ``keep``, and
        the errors it printed."""
        lines = []
        for i, label in enumerate(self.labels):
            code = self.returncodes[i]
            ended = "still running, stopped by us" if code is None else f"exit code {code}"
            lines.append(f"{label}: {ended}")
            lines += [f"    {line}" for line in self.outputs[i] if keep and line.startswith(keep)]
            lines += [f"    {error}" for error in self.errors(i)]
        return "\n".join(lines)


def run_agents(agents: list[Agent], timeout: float = 60.0, echo: bool = True,
               grace: float | None = None) -> AgentsResult:
    """Run the agents to the end (or ``timeout`` seconds), streaming their output. With
    ``grace``, stop the others that many seconds after one agent failed: torchrun does
    not tell the other nodes, whose workers may wait for the dead ones for a long time."""
    run_dir = new_run_dir()
    labels = [f"node{i}" for i in range(len(agents))] if len(agents) > 1 else \
        [agents[0].module.rsplit(".", 1)[-1].replace("run", "torchrun")]
    runner = _Runner(agents, labels, run_dir, echo)
    try:
        runner.run(timeout, grace)
        returncodes = runner.returncodes()  # before the stop: None for those it stops
        stopped = runner.stop()
        return AgentsResult(labels, returncodes, [list(log) for log in runner.outputs],
                            RunFiles(run_dir).results(), runner.seconds, stopped)
    finally:
        runner.stop()
        shutil.rmtree(run_dir, ignore_errors=True)


class _Runner:
    def __init__(self, agents: list[Agent], labels: list[str], run_dir: str, echo: bool):
        self.agents, self.labels, self.run_dir = agents, labels, run_dir
        self.echo = make_echo(echo)
        self.processes: list[subprocess.Popen | None] = [None] * len(agents)
        self.outputs = [KeptLog(LOG_LIMIT_BYTES) for _ in agents]  # bounded, as a rank's
        self.output = OutputReader()
        self.seconds = 0.0
        self.first_failure: float | None = None
        self.deadline: Deadline | None = None
        self.over = False
        self.network = PrivateNetwork()  # for the agents on this machine

    def run(self, timeout: float, grace: float | None) -> None:
        self.deadline = Deadline(time.monotonic(), timeout, grace=grace)
        self._start_due(())
        loop = RunLoop(self.output, self.echo, self._take_and_start)
        loop.run(lambda: self.output.open and not self.over, self._step)
        self.seconds = time.monotonic() - self.deadline.started

    def _step(self, now: float) -> float:
        end = self.deadline.ends_at(self._note_failure())
        self.over = now >= end
        return end

    def _take_and_start(self, out: Output) -> None:
        self._take(out)
        self._start_due(out.lines)

    def _note_failure(self) -> float | None:
        """When an agent was first seen to have failed (exited with a code other than 0)."""
        if self.first_failure is None and any(
                p is not None and p.poll() not in (None, 0) for p in self.processes):
            self.first_failure = time.monotonic()
        return self.first_failure

    def _start_due(self, new_lines: Sequence[str]) -> None:
        """Start the agents not started yet whose ``start_when`` is in ``new_lines``."""
        for i, agent in enumerate(self.agents):
            if self.processes[i] is None and (not agent.start_when or any(
                    agent.start_when in line for line in new_lines)):
                self._start(i)

    def _start(self, i: int) -> None:
        agent = self.agents[i]
        env = {**os.environ, "PYTHONUNBUFFERED": "1", RUN_DIR_VAR: self.run_dir,
               "PET_LOG_DIR": os.path.join(self.run_dir, "logs", self.labels[i]),
               "PYTHONPATH": package_pythonpath(os.environ), **agent.env}
        process = subprocess.Popen(self.network.command(agent.host, agent.argv()),
                                   stdin=subprocess.DEVNULL,
                                   stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                   env=env, start_new_session=True)
        self.processes[i] = process
        self.output.add(process.stdout, owner=i)

    def _take(self, out: Output) -> None:
        self.outputs[out.owner].extend(out.lines)
        self.echo.show(self.labels[out.owner],
                       [line for line in out.lines if not _NOT_ECHOED.match(line)])

    def returncodes(self, seconds: float = 5.0) -> list[int | None]:
        """Once every output ended, the agents exit right after: give them a moment."""
        if not self.output.open:
            until = time.monotonic() + seconds
            for process in filter(None, self.processes):
                try:
                    process.wait(timeout=max(0.0, until - time.monotonic()))
                except subprocess.TimeoutExpired:
                    pass
        return [p.poll() if p is not None else None for p in self.processes]

    def stop(self) -> tuple[int, ...]:
        """Kill every agent still running with all its workers, collect what they had
        printed, and return the pids that were killed (each agent first)."""
        stopped: list[int] = []
        try:
            for process in filter(None, self.processes):
                if process.poll() is None:
                    stopped += kill_tree(process.pid)
                process.wait()
            until = time.monotonic() + AGENTS_DRAIN_S
            while self.output.open and time.monotonic() < until:
                for out in self.output.read(until):
                    self._take(out)
        finally:
            self.output.close()
            self.echo.close()
            self.network.close()
        return tuple(stopped)
