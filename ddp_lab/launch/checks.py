"""Input checks that run before any process starts, with errors that say what to do."""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from pathlib import Path

from ddp_lab.launch import backends
from ddp_lab.launch.config import LaunchConfig
from ddp_lab.launch.network.placement import checked_placement

LAUNCHERS = ("ddp_lab", "torchrun")
# A week: a run that may hang longer is better split into checkpointed parts; and the
# process-group timeout (timeout + 60 s) must stay a sane number of milliseconds for gloo.
MAX_TIMEOUT_S = 7 * 24 * 3600.0
# Linux refuses to exec a program with one environment string ("NAME=value\0") longer than
# MAX_ARG_STRLEN = 32 pages = 128 KiB (include/uapi/linux/binfmts.h; execve(2) "Limits on
# size of arguments and environment"): torchrun, spawned DataLoader workers or compilers a
# rank starts would all fail with E2BIG.
MAX_ENV_STRING = 32 * 4096
# Each rank's environment travels to the fork server in one message (MAX_MESSAGE, 1 MiB, in
# forkserver/protocol.py) next to this process's own environment; execve allows a quarter of
# the stack limit (usually 2 MiB) for arguments and environment together.
MAX_ENV_TOTAL = 512 * 1024


def checked_config(world_size, backend="auto", timeout=60.0, env=None, *, echo=True,
                   network=None, script=None, init_group=True, hosts=None) -> LaunchConfig:
    """The run's settings from the caller's own arguments (run, run_script, spawn, Ranks),
    each checked here and in this order, so that every entry point refuses the same bad input
    with the same words, before any process starts. ``script``: run_script's (path,
    script_args) as given (None: a function runs); ``init_group=False``: fn joins the group
    itself (spawn). ``hosts``: ``(hosts, nproc_per_node, via, controller)`` as given (ranks
    on other hosts: remote/launchers.py), None: this machine."""
    path, script_args = (None, ()) if script is None else check_script(*script)
    world_size, backend = check_world_size(world_size), check_backend(backend)
    timeout, env = check_timeout(timeout), check_env(env)
    if hosts is None:
        placement = checked_placement(network, world_size, backend)
    else:
        placement = _checked_hosts(network, hosts, world_size)
    return LaunchConfig(world_size=world_size, backend=backend, timeout=timeout, env=env,
                        echo=bool(echo), script=path, script_args=script_args,
                        init_group=init_group, placement=placement)


def _checked_hosts(network, hosts: tuple, world_size: int):
    from ddp_lab.launch.remote.launchers import checked_hosts
    if network is not None:
        raise ValueError("network= shapes links between ranks on this machine; with hosts= "
                         "the ranks talk over the hosts' own network: give one of the two")
    return checked_hosts(*hosts, world_size)


def check_world_size(world_size) -> int:
    if isinstance(world_size, bool) or not isinstance(world_size, int):
        raise TypeError(f"world_size must be a positive int (the number of ranks), "
                        f"got {world_size!r} of type {type(world_size).__name__}")
    if world_size < 1:
        raise ValueError(f"world_size must be at least 1, got {world_size}; "
                         "try world_size=2 or 4 on a laptop")
    return world_size


def check_backend(backend) -> str:
    if not backends.is_known(backend):
        raise ValueError(f"unknown backend {backend!r}: use 'auto' (the default: "
                         f"'{backends.GPU_AND_CPU}' where every rank has a GPU of its own, "
                         "so CPU tensors go through gloo and CUDA tensors through NCCL; "
                         "else 'gloo'), 'gloo' (CPU, works everywhere), 'nccl' (CUDA tensors "
                         "only, one GPU per rank) or device:backend pairs of those, as "
                         "torch writes them")
    return backend


def check_launcher(launcher) -> str:
    return _check_choice("launcher", launcher, LAUNCHERS,
                         "'ddp_lab' (the default: ranks forked from a warm fork server, fast) "
                         "or 'torchrun' (torch's own elastic agent, as `torchrun --standalone` "
                         "starts them)")


def _check_choice(what: str, value, choices: tuple, advice: str):
    if value not in choices:
        raise ValueError(f"unknown {what} {value!r}: use {advice}")
    return value


def check_timeout(timeout) -> float:
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)):
        raise TypeError(f"timeout must be a number of seconds, got {timeout!r}")
    if not (timeout > 0 and math.isfinite(timeout)):
        raise ValueError(f"timeout must be a positive, finite number of seconds, got "
                         f"{timeout!r}; it is how long the ranks may run before the launcher "
                         "stops them and shows where each one was stuck")
    if timeout > MAX_TIMEOUT_S:
        raise ValueError(f"timeout={timeout!r} s is more than the 7 days ({MAX_TIMEOUT_S:.0f} "
                         "s) a run may last: it is how long a hung run waits before the "
                         "launcher stops it and shows where each rank was stuck. Use at most "
                         "timeout=604800, and split longer jobs into parts that checkpoint")
    return float(timeout)


def check_env(env) -> dict[str, str]:
    """``env`` checked, and the documented switches it or this process's environment set
    (``DDP_LAB_ISOLATION``, ``DDP_LAB_RANK_LIMITS``): a typo there fails here, not later."""
    checked = _checked_env(env)
    check_switches(checked)
    return checked


def check_switches(env: Mapping[str, str]) -> None:
    """The kernel's isolation setting is read when its fork server starts, so a run's
    ``env=`` cannot change it; rank limits may come from either."""
    from ddp_lab.launch.network.isolation import MODE_VAR, mode
    from ddp_lab.launch.rank.limits import LIMITS_VAR, parse_limits
    if MODE_VAR in env:
        raise ValueError(f"{MODE_VAR} is this kernel's setting, not a run's: set "
                         f"os.environ[{MODE_VAR!r}] before the kernel's first run (then "
                         "ddp_lab.shutdown() to apply a change), not in env=")
    mode()
    parse_limits({**os.environ, **env}.get(LIMITS_VAR, ""))


def _checked_env(env) -> dict[str, str]:
    if env is None:
        return {}
    if not isinstance(env, Mapping):
        raise TypeError(f"env must be a dict of str -> str, got {type(env).__name__}")
    bad = {k: v for k, v in env.items() if not (isinstance(k, str) and isinstance(v, str))}
    if bad:
        raise TypeError(f"env must map str to str (environment variables are text); "
                        f"fix these entries: {bad!r}")
    total = sum(_env_entry_size(name, value) for name, value in env.items())
    if total > MAX_ENV_TOTAL:
        raise ValueError(f"env holds {total} bytes in all, more than the {MAX_ENV_TOTAL // 1024}"
                         " KiB it may: every rank receives its environment in one message, and"
                         " Linux limits a program's environment too. " + _ENV_ADVICE)
    return dict(env)


_ENV_ADVICE = ("Pass large data as args= (or script_args=), or write it to a file and pass "
               "the file's path in env.")


def _env_entry_size(name: str, value: str) -> int:
    """Bytes of ``NAME=value\0`` as execve sees them, after checking it can be one."""
    if not name or "=" in name:
        raise ValueError(f"env name {name!r} is not a variable name: the name is what comes "
                         "before the first '=' of NAME=value, so it must be non-empty and "
                         "hold no '='. Write env={'NAME': 'value'}")
    if "\0" in name or "\0" in value:
        raise ValueError(f"env[{name!r}] contains a NUL character ('\\0'): environment "
                         "variables are C strings, which end at the first NUL; remove it")
    try:
        size = len(os.fsencode(name)) + len(os.fsencode(value)) + 2
    except UnicodeEncodeError as exc:
        raise ValueError(f"env[{name!r}] cannot be encoded for the operating system "
                         f"({exc}); use plain text") from None
    if size > MAX_ENV_STRING:
        raise ValueError(f"env[{name!r}] is {size} bytes: Linux refuses to start any program "
                         f"whose environment holds a string over {MAX_ENV_STRING // 1024} KiB "
                         "(MAX_ARG_STRLEN), so the ranks could not start subprocesses. "
                         + _ENV_ADVICE)
    return size


def check_callable(fn) -> None:
    if not callable(fn):
        raise TypeError(f"fn must be a function (called on every rank), got {fn!r}; "
                        "to run a file use ddp_lab.run_script(path, ...)")


def check_call_args(args, kwargs) -> tuple[tuple, dict]:
    if not isinstance(args, (tuple, list)):
        raise TypeError(f"args must be a tuple of positional arguments, got "
                        f"{type(args).__name__}; for one argument write args=(x,)")
    if kwargs is not None and not isinstance(kwargs, Mapping):
        raise TypeError(f"kwargs must be a dict, got {type(kwargs).__name__}")
    return tuple(args), dict(kwargs or {})


def check_signature(fn, args: tuple, kwargs: dict, advice: str, call: str = "") -> None:
    """A TypeError now, not one per rank later, when ``fn(*args, **kwargs)`` cannot bind:
    typically a function written for torch.multiprocessing.spawn, ``fn(rank, world_size)``,
    handed to ``ddp_lab.run`` (``advice`` says what to call instead; ``call`` shows the
    call as the caller wrote it)."""
    import inspect
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):  # some built-ins have none: the call itself will tell
        return
    try:
        signature.bind(*args, **kwargs)
    except TypeError as exc:
        name = getattr(fn, "__name__", "fn")
        call = call or f"args={args!r}" + (f", kwargs={kwargs!r}" if kwargs else "")
        raise TypeError(f"{name}{signature} cannot be called with {call} ({exc}). "
                        f"{advice}") from None


def check_script(path, script_args) -> tuple[str, tuple[str, ...]]:
    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"script must be a path to a Python file, got {path!r}")
    script = Path(path).expanduser().resolve()
    if not script.is_file():
        raise ValueError(f"script {str(path)!r} not found (looked at {script}); "
                         "check the path relative to the notebook's folder")
    if isinstance(script_args, (str, bytes)) or not all(
            isinstance(a, str) for a in script_args):
        raise TypeError("script_args must be a list of strings, e.g. ['--epochs', '1']")
    return str(script), tuple(script_args)


def check_gpus(backend: str, world_size: int, gpu_count: int) -> None:
    """NCCL gives each rank a GPU of its own (two ranks on one device: NCCL refuses), so
    a backend that sends CUDA tensors through NCCL needs as many GPUs as ranks."""
    if backends.uses_nccl(backend) and gpu_count < world_size:
        raise ValueError(f"backend={backend!r} needs one GPU per rank: world_size="
                         f"{world_size} but {gpu_count} GPU(s) are visible. Use "
                         "backend='gloo' (CPU) or 'auto' (gloo there), or a world_size of at "
                         "most the GPU count")


# Limits of one machine, checked before any rank is forked (DDP_LAB_SKIP_LIMITS=1 skips them).
SKIP_LIMITS_VAR = "DDP_LAB_SKIP_LIMITS"
RANKS_PER_CORE = 32  # 256 ranks on 2 cores still start, but take 16 s before fn even runs
# A rank's own memory once its gloo group is up and has run an all_reduce (psutil
# memory_full_info inside the rank, torch 2.13 CPU, 2 cores): USS 9 MiB, PSS 18 MiB at 16
# ranks (39 MiB at 4: forked ranks share torch's pages with the fork server, and PSS splits
# them among fewer processes); 256 no-op ranks took 3 GB in all, 12 MiB each. 32 MiB leaves
# room for the user's first tensors and still refuses what cannot fit.
RANK_MEMORY_MIB = 32
# Descriptors (measured the same way): the launcher holds about 2 per rank (its output pipe
# and its store connection); a rank holds 12 of its own plus n - 1 gloo sockets (full mesh).
# 64 leaves room for the user's files and DataLoader pipes.
LAUNCHER_FDS_PER_RANK = 2
RANK_FDS_BASE = 64


def check_resources(world_size: int) -> None:
    """Refuse a world this machine cannot hold, before a rank is forked: cores, memory,
    file descriptors, each with the limit that was hit."""
    if os.environ.get(SKIP_LIMITS_VAR) == "1":
        return
    problems = [p(world_size) for p in (_memory_problem, _descriptors_problem, _cores_problem)]
    problems = [p for p in problems if p]
    if problems:
        raise ValueError(f"world_size={world_size} is more than this machine can run:\n"
                         + "".join(f"  - {p}\n" for p in problems) + "Use a smaller "
                         f"world_size, or set {SKIP_LIMITS_VAR}=1 in os.environ to start it "
                         "anyway.")


def _cores_problem(world_size: int) -> str:
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    limit = RANKS_PER_CORE * (cores or 1)
    if world_size > limit:
        return (f"cores: {cores} CPU core(s) run at most {limit} ranks ({RANKS_PER_CORE} per "
                "core); beyond that, starting the ranks alone takes many seconds")
    return ""


def _memory_problem(world_size: int) -> str:
    import psutil
    available = psutil.virtual_memory().available >> 20
    needed = world_size * RANK_MEMORY_MIB
    if needed > available:
        return (f"memory: {world_size} ranks need about {needed} MiB ({RANK_MEMORY_MIB} MiB "
                f"each) but only {available} MiB is available")
    return ""


def _descriptors_problem(world_size: int) -> str:
    import resource
    soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return ""
    launcher = _open_descriptors() + LAUNCHER_FDS_PER_RANK * world_size
    rank = RANK_FDS_BASE + world_size - 1
    if max(launcher, rank) > soft:
        return (f"open files: the limit (ulimit -n) is {soft}, but the launcher needs about "
                f"{launcher} descriptors and each rank about {rank} (gloo opens a socket to "
                "every other rank), so raise it with `ulimit -n` before starting Jupyter")
    return ""


def _open_descriptors() -> int:
    try:
        return len(os.listdir("/proc/self/fd"))
    except OSError:
        return 64
