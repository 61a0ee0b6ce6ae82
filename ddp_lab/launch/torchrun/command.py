"""Real ``torchrun`` as a subprocess of the notebook, cleaned up whatever happens.

torchrun's agent starts every worker in a session of its own (``start_new_session=True`` in
torch.distributed.elastic's SubprocessHandler), so killing the agent's process group does
not reach the workers: a crashed or interrupted demo would leave them running. Here the
agent runs in a new session too, and cleanup collects the whole process tree first, asks the
agent to stop (SIGTERM: it then stops its workers itself), and SIGKILLs whatever is left.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass

from ddp_lab.launch.process_tree import descendants, kill_all, send

STOP_GRACE_S = 5.0  # how long the agent gets to stop its workers after SIGTERM


@dataclass(frozen=True)
class TorchrunResult:
    """What one torchrun invocation did: its command line, exit code and output."""

    command: tuple[str, ...]
    returncode: int | None  # None: it ran past the timeout and was stopped
    output: str  # stdout and stderr together, as a terminal would show them
    seconds: float
    stopped: tuple[int, ...] = ()  # pids still alive at the end (agent first), now gone

    @property
    def shell_command(self) -> str:
        """The command as one would type it: ``torchrun ...``."""
        return " ".join(["torchrun", *self.command[3:]])

    def lines(self, *needles: str) -> list[str]:
        """The output lines that contain any of ``needles`` (all lines without needles)."""
        return [line for line in self.output.splitlines()
                if not needles or any(n in line for n in needles)]

    def section(self, start: str, end: str | None = None) -> str:
        """The output from the first line holding ``start`` up to the line holding ``end``."""
        lines = self.output.splitlines()
        first = next((i for i, line in enumerate(lines) if start in line), None)
        if first is None:
            return ""
        rest = lines[first:]
        last = next((i for i, line in enumerate(rest[1:], 1) if end and end in line), None)
        return "\n".join(rest if last is None else rest[:last + 1])


def torchrun(target: list[str], nproc: int = 2, *, options: tuple[str, ...] = (),
             env: dict | None = None, timeout: float = 120.0,
             log_dir: str | None = None) -> TorchrunResult:
    """``python -m torch.distributed.run --standalone --nproc-per-node=N --log-dir DIR
    *options *target``.

    ``--standalone`` gives the run its own rendezvous on a free local port, so concurrent
    runs never collide. No process of the run survives this call, and no file either
    unless ``log_dir`` is given (torchrun's default is a new /tmp/torchelastic_* per run,
    which it leaves behind).
    """
    with tempfile.TemporaryDirectory(prefix="ddp_lab-torchrun-") as scratch:
        command = (sys.executable, "-m", "torch.distributed.run", "--standalone",
                   f"--nproc-per-node={nproc}", "--log-dir", log_dir or scratch, *options,
                   *target)
        return _run_agent(command, {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})},
                          timeout)


def _run_agent(command: tuple[str, ...], env: dict, timeout: float) -> TorchrunResult:
    began = time.monotonic()
    with tempfile.TemporaryFile() as out:
        agent = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, env=env,
                                 start_new_session=True)
        try:
            returncode = agent.wait(timeout)
        except subprocess.TimeoutExpired:
            returncode = None
        finally:
            stopped = stop_tree(agent)
        out.seek(0)
        output = out.read().decode("utf-8", "replace")
    return TorchrunResult(command, returncode, output, time.monotonic() - began, stopped)


def stop_tree(agent: subprocess.Popen) -> tuple[int, ...]:
    """Stop the agent and every process it started, however deep, then reap the agent.
    Returns the pids that were still alive (none after a normal end: the agent reaps its
    workers itself)."""
    alive = agent.poll() is None
    tree = descendants(agent.pid)  # listed first: once the agent dies they are orphans
    if not alive and not tree:
        return ()
    if alive:
        send(agent.pid, signal.SIGTERM, group=True)
        try:
            agent.wait(STOP_GRACE_S)
        except subprocess.TimeoutExpired:
            pass
    kill_all([*tree, agent.pid])
    agent.wait()
    return ((agent.pid,) if alive else ()) + tuple(tree)
