"""The rank side of a run: environment -> process group -> the user's code -> result.

This runs inside a process forked by the fork server (forkserver/server.py). Everything a rank needs
arrives in a RankSpec plus two descriptors: the pipe its output goes to, and the run's
lifeline (a pipe whose write end only the launcher holds; when it closes, because the run
ended or the launcher died, the rank kills itself, so no worker can outlive its launcher).
"""

from __future__ import annotations

import faulthandler
import linecache
import os
import signal
import sys
import threading
import time
from datetime import timedelta
from pathlib import Path

import cloudpickle

from ddp_lab.launch.config import RUN_DIR_VAR, RankSpec, RunFiles, write_pickle
from ddp_lab.launch.errors import safe_message, short_message
from ddp_lab.launch.rank import teardown
from ddp_lab.launch.rank.failure import RankFailure, failure_of, write_failure
from ddp_lab.launch.rank.limits import apply_limits

STACK_SIGNAL = signal.SIGUSR1


def rank_main(spec: RankSpec, output_fd: int, lifeline_fd: int, body=None) -> None:
    """Never returns: a forked rank must not fall back into the fork server's loop.
    ``body(spec)`` -> exit code replaces the one-shot target: a live rank's loop of calls
    (live/rank_loop.py)."""
    _become_rank_process(spec, output_fd)
    _watch_lifeline(lifeline_fd)
    stack_file = _arm_stack_dump(RunFiles(spec.run_dir).stack(spec.rank))
    destroyed_groups: list = []  # see teardown.py: the DDP tutorial's cleanup() could hang
    teardown.keep_destroyed_groups(destroyed_groups)
    code = (body or _run_target)(spec)
    teardown.release(destroyed_groups)  # the user's objects are gone by now
    flush_streams()
    stack_file.close()
    os._exit(code)


def _become_rank_process(spec: RankSpec, output_fd: int) -> None:
    os.setpgid(0, 0)  # own group: the launcher kills the rank and its children together
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    os.dup2(output_fd, 1)
    os.dup2(output_fd, 2)
    os.close(output_fd)
    for stream in (sys.stdout, sys.stderr):
        stream.reconfigure(line_buffering=True, write_through=True)
    os.environ.clear()
    os.environ.update(spec.env)
    apply_limits(spec.limits)
    os.chdir(spec.cwd)
    sys.path[:] = list(spec.sys_path)
    import torch
    import torch.distributed as dist
    torch.set_num_threads(spec.threads)
    _reseed_random_generators(torch)
    # torch read TORCH_DISTRIBUTED_DEBUG when the fork server imported it: read it again
    dist.set_debug_level_from_env()


def _reseed_random_generators(torch) -> None:
    """Fresh seeds from the OS, as a separately started process (torchrun's) would have:
    a forked rank inherits the fork server's generators, so without this every rank of
    every run would draw the same "random" numbers. Code that wants reproducibility seeds
    explicitly, as it must under torchrun too (notebook 05)."""
    import random

    import numpy
    random.seed()
    numpy.random.seed()
    torch.seed()


def _watch_lifeline(lifeline_fd: int) -> None:
    """When the lifeline closes (the run ended, or the launcher died), die. The fork server
    that forked us is a child subreaper (forkserver/reaper.py): it gives our helpers a grace (so
    multiprocessing's resource tracker can unlink what it tracks) and then kills them,
    wherever they moved. If it is gone too, nobody will: take our whole tree down."""
    import psutil  # imported now: the lifeline may end while the main thread imports

    server = os.getppid()

    def watch() -> None:
        while os.read(lifeline_fd, 1):
            pass
        if os.getppid() != server:
            _kill_descendants(psutil)
            os.killpg(0, signal.SIGKILL)
        os.kill(os.getpid(), signal.SIGKILL)

    threading.Thread(target=watch, name="ddp_lab-lifeline", daemon=True).start()


def _kill_descendants(psutil) -> None:
    for child in psutil.Process().children(recursive=True):
        try:
            child.kill()
        except psutil.Error:
            pass


def _arm_stack_dump(path: Path):
    """On STACK_SIGNAL, write every thread's Python stack; works even inside a blocked
    collective because faulthandler writes from the C signal handler."""
    stack_file = open(path, "w")
    faulthandler.register(STACK_SIGNAL, file=stack_file, all_threads=True, chain=False)
    faulthandler.enable(file=sys.stderr)  # segfaults print a stack too
    return stack_file


def _run_target(spec: RankSpec) -> int:
    files = RunFiles(spec.run_dir)
    try:
        if spec.script is None:
            _write_result(files.result(spec.rank), _call_function(spec, files))
        else:
            _run_script(spec)
        _mark_finished(files.finished(spec.rank))
        destroy_group()
        return 0
    except SystemExit as exc:
        code = _exit_code(exc)
        if code == 0:  # sys.exit(0) ends a script as its last line does
            _mark_finished(files.finished(spec.rank))
        return code
    except BaseException as exc:  # noqa: BLE001 - every failure must reach the launcher
        write_error(files.error(spec.rank), exc)
        return 1


def _mark_finished(path: Path) -> None:
    """The user's code returned: whatever kills the rank from now on (destroying the
    group, the exit) is teardown, and the launcher says so (verdict/outcome.py)."""
    path.write_text(f"{time.monotonic()}\n")


def _call_function(spec: RankSpec, files: RunFiles):
    fn, args, kwargs, sources = cloudpickle.loads(files.payload.read_bytes())
    linecache.cache.update(sources)  # tracebacks can quote notebook cells
    if spec.init_group:  # else ddp_lab.spawn: fn sets up its own device and group
        init_group(spec)
    return fn(*args, **kwargs)


def init_group(spec: RankSpec) -> None:
    import torch.distributed as dist
    _select_device(spec)
    dist.init_process_group(spec.backend, init_method="env://",
                            timeout=timedelta(seconds=spec.pg_timeout_s))


def _select_device(spec: RankSpec) -> None:
    """Under NCCL ("nccl", or "auto"'s "cpu:gloo,cuda:nccl") each rank owns GPU LOCAL_RANK,
    set before any CUDA tensor: otherwise every rank's first one lands on GPU 0."""
    if spec.gpu_per_rank:
        import torch
        torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))


def _run_script(spec: RankSpec) -> None:
    import runpy
    sys.argv = [spec.script, *spec.script_args]
    sys.path.insert(0, str(Path(spec.script).resolve().parent))
    _select_device(spec)
    runpy.run_path(spec.script, run_name="__main__")


def destroy_group() -> None:
    import torch.distributed as dist
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


def _exit_code(exc: SystemExit) -> int:
    if exc.code is None:
        return 0
    if isinstance(exc.code, int):
        return exc.code
    print(exc.code, file=sys.stderr)
    return 1


def _write_result(path: Path, value) -> None:
    try:
        write_pickle(path, to_cpu(value))
    except Exception as exc:  # noqa: BLE001 - pickling fails in many ways
        raise TypeError(f"this rank's value (what fn returned, or ddp_lab.report got) cannot "
                        f"be sent back to the caller ({type(exc).__name__}: "
                        f"{safe_message(exc)}); send plain data: numbers, strings, lists, "
                        "dicts, CPU tensors") from None  # the cause is in the message


def write_error(path: Path, exc: BaseException) -> None:
    write_failure(path, record_failure(exc))


def error_record(exc: BaseException) -> dict:
    """The failure as a live rank's reply carries it: plain data (rank/failure.py)."""
    return record_failure(exc).to_plain()


def record_failure(exc: BaseException) -> RankFailure:
    """What the launcher learns of a failure (type, message, traceback, when)."""
    failure = failure_of(exc, time.monotonic())
    # One line live; the whole traceback reaches the launcher in the record (and the logs),
    # so a crash of 8 ranks does not print 8 tracebacks into the cell.
    sys.stderr.write(f"{failure.type_name}: {short_message(failure.message, limit=200)}\n")
    return failure


def to_cpu(value):
    """Results cross to the kernel, which should never have to touch a GPU to read them."""
    import torch
    if isinstance(value, torch.Tensor):
        return value.detach().cpu()
    if isinstance(value, (list, tuple)) and type(value) in (list, tuple):
        return type(value)(to_cpu(v) for v in value)
    if type(value) is dict:
        return {k: to_cpu(v) for k, v in value.items()}
    return value


def flush_streams() -> None:
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass


def report(value):
    """Send ``value`` back as this rank's result (``res.values[rank]`` of ``run_script``).

    Under plain ``torchrun`` or ``python`` it does nothing, so worker scripts run unchanged
    everywhere. The last call wins. Returns ``value`` for convenience.
    """
    run_dir = os.environ.get(RUN_DIR_VAR)
    if run_dir:
        _write_result(RunFiles(run_dir).result(int(os.environ["RANK"])), value)
    return value
