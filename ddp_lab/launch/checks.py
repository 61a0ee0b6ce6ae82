"""Input checks that run before any process starts, with errors that say what to do."""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from pathlib import Path

BACKENDS = ("auto", "gloo", "nccl")
LAUNCHERS = ("ddp_lab", "torchrun")


def check_world_size(world_size) -> int:
    if isinstance(world_size, bool) or not isinstance(world_size, int):
        raise TypeError(f"world_size must be a positive int (the number of ranks), "
                        f"got {world_size!r} of type {type(world_size).__name__}")
    if world_size < 1:
        raise ValueError(f"world_size must be at least 1, got {world_size}; "
                         "try world_size=2 or 4 on a laptop")
    return world_size


def check_backend(backend) -> str:
    return _check_choice("backend", backend, BACKENDS,
                         "'gloo' (CPU, works everywhere), 'nccl' (one GPU per rank) or 'auto' "
                         "(nccl when there are enough GPUs, else gloo)")


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
    return float(timeout)


def check_env(env) -> dict[str, str]:
    if env is None:
        return {}
    if not isinstance(env, Mapping):
        raise TypeError(f"env must be a dict of str -> str, got {type(env).__name__}")
    bad = {k: v for k, v in env.items() if not (isinstance(k, str) and isinstance(v, str))}
    if bad:
        raise TypeError(f"env must map str to str (environment variables are text); "
                        f"fix these entries: {bad!r}")
    return dict(env)


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
    if backend == "nccl" and gpu_count < world_size:
        raise ValueError(f"backend='nccl' needs one GPU per rank: world_size={world_size} "
                         f"but {gpu_count} GPU(s) are visible. Use backend='gloo' (CPU) or "
                         "'auto', or a world_size of at most the GPU count")
