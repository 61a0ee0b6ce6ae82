"""Notebook 09, part 1: torchrun on one machine. The plain command, what it tells each
worker, the legacy ``--local-rank`` argument, torchrun from Python (``elastic_launch``)
with a restart after a failure, and ``run_script(..., launcher="torchrun")``.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import io
import os
import signal
import tempfile
import uuid
from dataclasses import dataclass

from ddp_lab.launch.torchrun.agents import Agent, AgentsResult, run_agents
from ddp_lab.course.netns import loopback_hosts
from ddp_lab.course.ports import lost_port_race, say_lost_port_race
from ddp_lab.scripts import script_path
from ddp_lab.scripts.print_env import TORCHRUN_VARS

# The options of `torchrun -h` in torch 2.4, by their argparse names.
TORCH_2_4_OPTIONS = ("nnodes", "nproc_per_node", "rdzv_backend", "rdzv_endpoint", "rdzv_id",
                "rdzv_conf", "standalone", "max_restarts", "monitor_interval", "start_method",
                "role", "module", "no_python", "run_path", "log_dir", "redirects", "tee",
                "node_rank", "master_addr", "master_port")


def options_since_torch_2_4() -> list[tuple[str, str]]:
    """torchrun options this torch has and torch 2.4's help did not list: (flag, help)."""
    from torch.distributed.run import get_args_parser
    skip = set(TORCH_2_4_OPTIONS) | {"help", "training_script", "training_script_args"}
    return [(action.option_strings[0], " ".join((action.help or "").split())[:110])
            for action in get_args_parser()._actions if action.dest not in skip]


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
                       tries: int = 3) -> ElasticLaunch:
    """``elastic_launch(LaunchConfig(...), fn)(*args)``: torchrun's agent in this process.

    ``fn`` travels to the workers by reference (multiprocessing's spawn), so it must live
    in an importable module, as with ``mp.spawn``. The agent installs its own handlers
    for SIGINT/SIGTERM/SIGHUP/SIGQUIT in the calling process and leaves them there, so
    we restore the kernel's (else the stop button raises torch's SignalException). The
    restart needs torch 2.13's shared rendezvous store turned off (pytorch/pytorch#135712:
    restarted workers can read the previous attempt's gloo addresses), as notebook 08 does.
    torch's spawn leaves a ``pytorch-errorfile-*.pickle`` per failed worker in the temp
    folder; they go to the log folder, removed with it. Without the shared store the agent
    picks the workers' port with a bind and a close, and rank 0 binds it once torch is
    imported: a launch that lost that port to another program is started again (notebook
    08's ``recovery.killed_once_under_torchrun`` does the same)."""
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    with tempfile.TemporaryDirectory(prefix=f"ddp_lab-{os.getpid()}-") as log_dir, \
            _spawn_error_files_in(log_dir), _signal_handlers_kept() as left, \
            _env_set(TORCH_DISABLE_SHARE_RDZV_TCP_STORE="1"):
        for attempt in range(1, tries + 1):
            try:
                values = _elastic_launch(fn, args, nproc, max_restarts, log_dir)
                break
            except ChildFailedError as err:
                if attempt == tries or not lost_port_race(str(err)):
                    raise
                say_lost_port_race("launching again")
    return ElasticLaunch(dict(sorted(values.items())), left["SIGINT"])


def _elastic_launch(fn, args: tuple, nproc: int, max_restarts: int, log_dir: str) -> dict:
    """One ``elastic_launch`` of ``fn(*args)``, its logs under ``log_dir``."""
    from torch.distributed.elastic.multiprocessing import DefaultLogsSpecs, Std
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch
    config = LaunchConfig(
        min_nodes=1, max_nodes=1, nproc_per_node=nproc, run_id=str(uuid.uuid4()),
        rdzv_backend="c10d", rdzv_endpoint="localhost:0", max_restarts=max_restarts,
        monitor_interval=0.1, start_method="spawn", log_line_prefix_template="[rank ${rank}] ",
        logs_specs=DefaultLogsSpecs(log_dir=log_dir, tee=Std.ALL))
    return elastic_launch(config, fn)(*args)


@contextlib.contextmanager
def _spawn_error_files_in(folder: str):
    """torch's spawn (``start_processes``) makes a traceback file per worker with
    ``tempfile.NamedTemporaryFile(delete=False)`` and never removes the ones failed workers
    wrote. Until the block ends, that one module's ``tempfile`` makes them in ``folder``.
    Not ``tempfile.tempdir``: the whole process would see it, and torch's inductor keeps
    the first temp folder it sees in ``TORCHINDUCTOR_CACHE_DIR`` for good."""
    spawn = importlib.import_module("torch.multiprocessing.spawn")  # the module, not the function
    saved = spawn.tempfile
    spawn.tempfile = _TempfileIn(folder)
    try:
        yield
    finally:
        spawn.tempfile = saved


class _TempfileIn:
    """The ``tempfile`` module, but ``NamedTemporaryFile`` makes its files in ``folder``."""

    def __init__(self, folder: str):
        self.folder = folder

    def NamedTemporaryFile(self, *args, **kwargs):  # noqa: N802 (tempfile's name)
        return tempfile.NamedTemporaryFile(*args, **{"dir": self.folder, **kwargs})

    def __getattr__(self, name: str):
        return getattr(tempfile, name)


@contextlib.contextmanager
def _env_set(**variables: str):
    """Set environment variables in this process (the agent reads them) until the block ends."""
    saved = {name: os.environ.get(name) for name in variables}
    os.environ.update(variables)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


@contextlib.contextmanager
def _signal_handlers_kept():
    """Put the caller's signal handlers (and torch's signal list variable) back on the
    way out; yields a dict that then names the handler found on each signal."""
    names = ("SIGINT", "SIGTERM", "SIGHUP", "SIGQUIT")
    saved = {name: signal.getsignal(getattr(signal, name)) for name in names}
    saved_env = os.environ.get("TORCHELASTIC_SIGNALS_TO_HANDLE")
    left: dict[str, str] = {}
    try:
        yield left
    finally:
        for name, handler in saved.items():
            current = signal.getsignal(getattr(signal, name))
            left[name] = getattr(current, "__name__", str(current))
            signal.signal(getattr(signal, name), handler)
        if saved_env is None:  # elastic_launch sets it whatever it was
            os.environ.pop("TORCHELASTIC_SIGNALS_TO_HANDLE", None)
        else:
            os.environ["TORCHELASTIC_SIGNALS_TO_HANDLE"] = saved_env
