"""``python -m ddp_lab.course.ch09_torchrun.elastic_launch``: notebook 09's ``elastic_launch``
in a process of its own (``torchrun.launch_from_python`` starts it as a torchrun agent is
started: in a private network, its output live, nothing left behind).

Never in the kernel: the agent's rendezvous store listens on every interface and the agent
unpickles the state it reads there, so whoever writes to that store runs code in the
process that hosts the agent. Here that is this child, in a network nobody else reaches.

The call (function by reference, its arguments, the launch settings) comes pickled in the
file ``DDP_LAB_ELASTIC_CALL`` names, in a folder only its user can read; the values and the
handler the agent left on SIGINT go back as this "rank 0"'s result in the run folder. When
the process that started it dies (a kernel killed), it stops as on SIGTERM: torch's agent
then stops its workers.
"""

from __future__ import annotations

import contextlib
import importlib
import multiprocessing
import os
import pickle
import signal
import sys
import tempfile
import threading
import time
import uuid

from ddp_lab.course.ports import lost_port_race, say_lost_port_race
from ddp_lab.launch.config import RUN_DIR_VAR, RunFiles, write_pickle

CALL_VAR = "DDP_LAB_ELASTIC_CALL"
ORPHAN_POLL_S = 0.5
# LaunchConfig's default is "spawn": every worker of every attempt is a fresh interpreter
# that imports torch. A fork server imports it once (the preload in main()) and forks each
# worker from there, for the first attempt and the restart alike: seconds saved on 2 cores.
# The entrypoint still travels by reference, as with spawn (it must be importable).
START_METHOD = "forkserver"
# multiprocessing's fork server listens on a Unix socket in a folder of its own under the temp
# folder (pymp-XXXXXXXX/listener-XXXXXXXX: 33 bytes more), and a socket path holds 107 bytes.
DEEPEST_TEMP_FOR_SOCKET = 107 - 33


def main() -> int:
    """Restarting needs torch 2.13's shared rendezvous store turned off (pytorch/pytorch#135712:
    restarted workers can read the previous attempt's gloo addresses), as notebook 08 does.
    Without the shared store the agent picks the workers' port with a bind and a close, and
    rank 0 binds it once torch is imported: a launch that lost that port (to another
    program of this user: nobody else is in this network) is started again."""
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    _stop_when_orphaned(os.getppid())
    with open(os.environ[CALL_VAR], "rb") as file:
        fn, args, nproc, max_restarts, tries = pickle.load(file)
    os.environ["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] = "1"
    multiprocessing.set_forkserver_preload(["torch"])  # see START_METHOD
    _start_fork_server()
    with tempfile.TemporaryDirectory(prefix=f"ddp_lab-{os.getpid()}-") as log_dir, \
            _spawn_error_files_in(log_dir):
        for attempt in range(1, tries + 1):
            try:
                values = _elastic_launch(fn, args, nproc, max_restarts, log_dir)
                break
            except ChildFailedError as err:
                if attempt == tries or not lost_port_race(str(err)):
                    raise
                say_lost_port_race("launching again")
    left = signal.getsignal(signal.SIGINT)
    write_pickle(RunFiles(os.environ[RUN_DIR_VAR]).result(0),
                 (dict(sorted(values.items())), getattr(left, "__name__", str(left))))
    return 0


def _start_fork_server() -> None:
    """Start multiprocessing's fork server now; where the temp folder is too deep for its
    socket (macOS's TMPDIR, a test's own folder: "AF_UNIX path too long"), under /tmp.
    Only ``tempfile.tempdir`` for this one call: multiprocessing keeps the folder it made
    for the socket, and removes it when this process exits."""
    from multiprocessing import forkserver
    if len(tempfile.gettempdir()) <= DEEPEST_TEMP_FOR_SOCKET:
        return forkserver.ensure_running()
    saved, tempfile.tempdir = tempfile.tempdir, "/tmp"
    try:
        forkserver.ensure_running()
    finally:
        tempfile.tempdir = saved


def _stop_when_orphaned(parent: int) -> None:
    """SIGTERM to this process once ``parent`` is gone (it is then no longer our parent)."""
    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(ORPHAN_POLL_S)
        os.kill(os.getpid(), signal.SIGTERM)

    threading.Thread(target=watch, name="ddp_lab-orphan-watch", daemon=True).start()


def _elastic_launch(fn, args: tuple, nproc: int, max_restarts: int, log_dir: str) -> dict:
    """One ``elastic_launch`` of ``fn(*args)``, its logs under ``log_dir``."""
    from torch.distributed.elastic.multiprocessing import DefaultLogsSpecs, Std
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch
    config = LaunchConfig(
        min_nodes=1, max_nodes=1, nproc_per_node=nproc, run_id=str(uuid.uuid4()),
        rdzv_backend="c10d", rdzv_endpoint="localhost:0", max_restarts=max_restarts,
        monitor_interval=0.1, start_method=START_METHOD,
        log_line_prefix_template="[rank ${rank}] ",
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


if __name__ == "__main__":
    sys.exit(main())
