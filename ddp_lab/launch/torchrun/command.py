"""``torchrun --standalone`` as one command from a notebook, its output read as one text.

The chapters that show what torchrun itself prints (its failure summary, its restarts)
read that text after the run, rather than live. The run is an ``agents.run_agents`` run
of a single agent on this machine: the same start, output, deadline and cleanup (the
agent and every worker killed, however deep) as the multi-node demos.
"""

from __future__ import annotations

from dataclasses import dataclass

from ddp_lab.launch.torchrun.agents import Agent, ThisMachine, run_agents


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
    """``python -m torch.distributed.run --standalone --nproc-per-node=N [--log-dir DIR]
    *options *target``.

    ``--standalone`` gives the run its own rendezvous on a free local port, so concurrent
    runs never collide. No process of the run survives this call, and no file either
    unless ``log_dir`` is given (torchrun's default is a new /tmp/torchelastic_* per run,
    which it leaves behind; without ``log_dir`` its logs go to a private folder instead).
    """
    chosen_log_dir = ("--log-dir", log_dir) if log_dir else ()
    agent = Agent(ThisMachine(), ("--standalone", f"--nproc-per-node={nproc}",
                                  *chosen_log_dir, *options, *target), env or {})
    result = run_agents([agent], timeout=timeout, echo=False)
    output = "".join(f"{line}\n" for line in result.outputs[0])
    return TorchrunResult(tuple(agent.argv()), result.returncodes[0], output, result.seconds,
                          result.stopped)
