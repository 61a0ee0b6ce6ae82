"""Start torchrun agents from a notebook, one per host, as you would type them on real
machines, and get back what they printed and what their workers reported.

Each agent is a real ``python -m torch.distributed.run ...`` process started on its host
(``ip netns exec`` for a namespace), in a session of its own. Its output streams live as
``[node0] ...``. Two additions to the command you see: ``--log-dir`` points into a private
folder (otherwise torchrun leaves a ``/tmp/torchelastic_*`` folder behind after every
run), and ``DDP_LAB_RUN_DIR`` names the same folder, so that ``ddp_lab.report(value)`` in
a worker lands there (the namespaces share this machine's disk). At the deadline, on an
exception or on the stop button, every agent and every worker is killed and the folder
removed.
"""

from __future__ import annotations

import os
import pickle
import re
import selectors
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from ddp_lab.course.netns import Host
from ddp_lab.launch.process_tree import kill_tree
from ddp_lab.launch.torchrun.session import package_pythonpath
from ddp_lab.launch.worker import RUN_DIR_VAR

# Not echoed (kept in the outputs): C++ stack frames under a torch warning, and a warning
# gVisor-style sandboxes trigger on every store connection (they report socket addresses
# no resolver knows); neither helps a reader of the notebook.
_NOT_ECHOED = re.compile(r"^(frame #\d+: |<omitting python frames>|Exception raised from |"
                         r"\[W[^\]]*\] \[c10d\] The hostname of the client socket cannot)")
_ERROR_LINE = re.compile(r"^(?:\[rank\d+\]: )?((?:[\w]+\.)*\w*(?:Error|Exception)): (.+)$")


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

    def command_line(self) -> str:
        env = " ".join(f"{k}={shlex.quote(v)}" for k, v in self.env.items())
        where = f"{self.host.name}$ "
        launcher = "torchrun" if self.module == "torch.distributed.run" else \
            f"python -m {self.module}"
        return f"{where}{env + ' ' if env else ''}{launcher} {shlex.join(self.args)}"


@dataclass(frozen=True)
class AgentsResult:
    """``returncodes[i]`` is None for an agent we stopped (or that never started);
    ``values`` maps each global rank to what its worker reported (last report wins)."""

    labels: list[str]
    returncodes: list[int | None]
    outputs: list[list[str]]
    values: dict
    seconds: float

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
    run_dir = tempfile.mkdtemp(prefix=f"ddp_lab-{os.getpid()}-")
    labels = [f"node{i}" for i in range(len(agents))] if len(agents) > 1 else \
        [agents[0].module.rsplit(".", 1)[-1].replace("run", "torchrun")]
    runner = _Runner(agents, labels, run_dir, echo)
    try:
        runner.run(timeout, grace)
        return AgentsResult(labels, runner.returncodes(), runner.outputs,
                            _reported_values(run_dir), runner.seconds)
    finally:
        runner.stop()
        shutil.rmtree(run_dir, ignore_errors=True)


class _Runner:
    def __init__(self, agents, labels, run_dir, echo):
        self.agents, self.labels, self.run_dir, self.echo = agents, labels, run_dir, echo
        self.processes: list[subprocess.Popen | None] = [None] * len(agents)
        self.outputs: list[list[str]] = [[] for _ in agents]
        self.partial = [b""] * len(agents)
        self.selector = selectors.DefaultSelector()
        self.seconds = 0.0
        self.first_failure: float | None = None

    def run(self, timeout: float, grace: float | None) -> None:
        started = time.monotonic()
        deadline = started + timeout
        self._start_due()
        while self.selector.get_map() and time.monotonic() < deadline:
            for key, _ in self.selector.select(min(0.25, deadline - time.monotonic())):
                self._read(key.data)
            self._start_due()
            if grace is not None and self._note_failure() is not None:
                deadline = min(deadline, self.first_failure + grace)
        self.seconds = time.monotonic() - started

    def _note_failure(self) -> float | None:
        """When an agent was first seen to have failed (exited with a code other than 0)."""
        if self.first_failure is None and any(
                p is not None and p.poll() not in (None, 0) for p in self.processes):
            self.first_failure = time.monotonic()
        return self.first_failure

    def _start_due(self) -> None:
        waiting = [i for i, process in enumerate(self.processes) if process is None]
        if not waiting:  # the usual case, on every pass of the read loop
            return
        text = "\n".join(line for lines in self.outputs for line in lines)
        for i in waiting:
            if (self.agents[i].start_when or "") in text:
                self._start(i)

    def _start(self, i: int) -> None:
        agent = self.agents[i]
        log_dir = os.path.join(self.run_dir, "logs", self.labels[i])
        argv = [sys.executable, "-m", agent.module, f"--log-dir={log_dir}", *agent.args]
        env = {**os.environ, "PYTHONUNBUFFERED": "1", RUN_DIR_VAR: self.run_dir,
               "PYTHONPATH": package_pythonpath(os.environ),
               **agent.env}
        process = subprocess.Popen(agent.host.command(argv), stdin=subprocess.DEVNULL,
                                   stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                   env=env, start_new_session=True)
        self.processes[i] = process
        os.set_blocking(process.stdout.fileno(), False)
        self.selector.register(process.stdout, selectors.EVENT_READ, i)

    def _read(self, i: int) -> None:
        stdout = self.processes[i].stdout
        try:
            chunk = os.read(stdout.fileno(), 1 << 16)
        except BlockingIOError:
            return
        if not chunk:
            self.selector.unregister(stdout)
            chunk = b"\n" if self.partial[i] else b""
        *lines, self.partial[i] = (self.partial[i] + chunk).split(b"\n")
        for raw in lines:
            line = raw.decode("utf-8", "replace").rstrip("\r")
            self.outputs[i].append(line)
            if self.echo and not _NOT_ECHOED.match(line):
                print(f"[{self.labels[i]}] {line}", flush=True)

    def returncodes(self, seconds: float = 5.0) -> list[int | None]:
        """Once every output ended, the agents exit right after: give them a moment."""
        if not self.selector.get_map():
            until = time.monotonic() + seconds
            for process in filter(None, self.processes):
                try:
                    process.wait(timeout=max(0.0, until - time.monotonic()))
                except subprocess.TimeoutExpired:
                    pass
        return [p.poll() if p is not None else None for p in self.processes]

    def stop(self) -> None:
        for process in self.processes:
            if process is None:
                continue
            if process.poll() is None:
                kill_tree(process.pid)
            process.wait()
            process.stdout.close()
        self.selector.close()


def _reported_values(run_dir: str) -> dict:
    values = {}
    for path in Path(run_dir).glob("rank*.result.pkl"):
        values[int(path.name[4:].split(".")[0])] = pickle.loads(path.read_bytes())
    return dict(sorted(values.items()))
