"""Notebook 09, part 1: torchrun on one machine. The plain command, what it tells each
worker, the legacy ``--local-rank`` argument, torchrun from Python (``elastic_launch``)
with a restart after a failure, and ``run_script(..., launcher="torchrun")``.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import pickle
import sys
import tempfile
from dataclasses import dataclass

from ddp_lab.course.ch09_torchrun import elastic_launch
from ddp_lab.course.ch09_torchrun.elastic_launch import CALL_VAR
from ddp_lab.launch.torchrun.agents import Agent, AgentsResult, ThisMachine, run_agents
from ddp_lab.course.netns import loopback_hosts
from ddp_lab.scripts import script_path
from ddp_lab.scripts.print_env import TORCHRUN_VARS


@dataclass(frozen=True)
class TorchrunOption:
    """One option of this torch's ``torchrun`` parser: its spellings, the environment
    variable it also reads (``PET_<DEST>`` for torch's ``env``/``check_env`` actions,
    T/distributed/argparse_util.py), its default here, and its help text."""

    flags: tuple[str, ...]
    dest: str
    env_var: str | None
    default: object
    help: str


def torchrun_options() -> list[TorchrunOption]:
    """The options of ``torchrun -h``, read from this torch's own parser
    (``torch.distributed.run.get_args_parser()``), in the order of the help text."""
    from torch.distributed.argparse_util import check_env, env
    from torch.distributed.run import get_args_parser
    return [TorchrunOption(tuple(action.option_strings), action.dest,
                           f"PET_{action.dest.upper()}" if isinstance(action, (env, check_env))
                           else None,
                           action.default, " ".join((action.help or "").split()))
            for action in get_args_parser()._actions
            if action.option_strings and action.dest != "help"]


def options_table(options: list[TorchrunOption], help_width: int = 44) -> str:
    """One line per option: its first long spelling, the variable it also reads, its
    default, the start of its help."""
    rows = [("option", "also read from", "default", "help")]
    for option in options:
        flag = next(f for f in option.flags if f.startswith("--"))
        default = "''" if option.default == "" else str(option.default)[:30]
        rows.append((flag, option.env_var or "-", default,
                     option.help[:help_width]))
    widths = [max(len(row[i]) for row in rows) for i in range(3)]
    return "\n".join(f"{a:{widths[0]}}  {b:{widths[1]}}  {c:{widths[2]}}  {d}"
                     for a, b, c, d in rows)


def env_table(values: dict, names=TORCHRUN_VARS) -> str:
    """One row per variable, one column per rank, from print_env.py's reports."""
    ranks = sorted(values)
    width = max(len(n) for n in names)
    rows = [f"{'':{width}}  " + "  ".join(f"rank {r:<10}" for r in ranks)]
    for name in names:
        cells = [str(values[r]["env"].get(name))[:15] for r in ranks]
        rows.append(f"{name:{width}}  " + "  ".join(f"{c:<15}" for c in cells))
    return "\n".join(rows)


def torchrun_standalone(nproc: int = 2, timeout: float = 60.0) -> AgentsResult:
    """``torchrun --standalone --nproc-per-node=N print_env.py``, as typed (the runner
    adds a private ``--log-dir``)."""
    agent = Agent(loopback_hosts()[0], ("--standalone", f"--nproc-per-node={nproc}", "-m",
                                        "ddp_lab.scripts.print_env"))
    print(agent.command_line())
    return run_agents([agent], timeout=timeout)


def legacy_launch(nproc: int = 2, timeout: float = 60.0) -> AgentsResult:
    """The pre-torchrun way: ``python -m torch.distributed.launch`` (deprecated, still there)."""
    agent = Agent(loopback_hosts()[0], (f"--nproc-per-node={nproc}",
                                        script_path("print_env.py")),
                  {"OMP_NUM_THREADS": "1"}, module="torch.distributed.launch")
    print(agent.command_line())
    return run_agents([agent], timeout=timeout)


def legacy_parser_on(argv: list[str]) -> str:
    """The argument parser of scripts written for ``torch.distributed.launch`` (``--local_rank``
    only, as its docs used to show) given what a launcher passes."""
    parser = argparse.ArgumentParser(prog="train.py")
    parser.add_argument("--local_rank", type=int)
    try:
        with contextlib.redirect_stderr(io.StringIO()) as err:
            return f"parsed: {parser.parse_args(argv)}"
    except SystemExit:  # argparse's way to fail: usage and error on stderr, then exit
        return f"failed: {err.getvalue().strip().splitlines()[-1]}"


# -- torchrun from Python -----------------------------------------------------------------
@dataclass(frozen=True)
class ElasticLaunch:
    """What ``elastic_launch`` returned (rank -> value) and which handler it had left on
    SIGINT before we put the kernel's back."""

    values: dict
    sigint_handler_left: str


def flaky_all_reduce(fail_rank: int = 1) -> dict:
    """An entrypoint for ``elastic_launch``: on the first attempt
    (TORCHELASTIC_RESTART_COUNT == 0) rank ``fail_rank`` crashes before joining the process
    group; torchrun stops its peer, restarts both, and the second attempt succeeds."""
    import torch
    import torch.distributed as dist
    rank, restart = int(os.environ["RANK"]), int(os.environ["TORCHELASTIC_RESTART_COUNT"])
    print(f"attempt {restart}: rank {rank} starting", flush=True)
    if restart == 0 and rank == fail_rank:
        raise RuntimeError(f"rank {rank}: simulated crash on attempt {restart}")
    dist.init_process_group("gloo", init_method="env://")
    total = torch.tensor([float(rank)])
    dist.all_reduce(total)
    dist.destroy_process_group()
    return {"rank": rank, "restart": restart, "sum": total.item(), "pid": os.getpid()}


def launch_from_python(fn, *args, nproc: int = 2, max_restarts: int = 1,
                       tries: int = 3, timeout: float = 240.0) -> ElasticLaunch:
    """``elastic_launch(LaunchConfig(...), fn)(*args)``: torchrun's agent, from Python.

    Not in this process: the agent's rendezvous store listens on every interface and the
    agent unpickles the state it reads there, so another user (or host) who writes to it
    runs code in the process that hosts the agent. It runs in a child process in a private
    network of its own (``elastic_launch.py``, started as one torchrun agent is, by
    ``run_agents``: live output, deadline, nothing left), which sends back the values and
    the handler the agent left on SIGINT. ``fn`` travels by reference, so it must live in
    an importable module, as with ``mp.spawn``; this process's import path goes along."""
    with tempfile.TemporaryDirectory(prefix=f"ddp_lab-{os.getpid()}-") as folder:
        call = os.path.join(folder, "call.pkl")  # a 0700 folder: ours alone to read
        with open(call, "wb") as file:
            pickle.dump((fn, args, nproc, max_restarts, tries), file)
        env = {CALL_VAR: call, "PYTHONPATH": os.pathsep.join(filter(None, sys.path))}
        result = run_agents([Agent(ThisMachine(), (), env, module=elastic_launch.__name__)],
                            timeout=timeout)
    if not result.ok or 0 not in result.values:
        errors = "; ".join(result.errors(0)) or "\n".join(result.outputs[0][-20:])
        raise RuntimeError(f"elastic_launch failed ({result.summary().splitlines()[0]}): "
                           f"{errors}")
    values, left = result.values[0]
    return ElasticLaunch(values, left)
