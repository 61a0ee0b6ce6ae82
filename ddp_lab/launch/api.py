"""``run`` and ``run_script``: check the input, start the ranks, return what they returned.

Ranks are fresh processes forked from a fork server that has torch imported
(forkserver/server.py),
never forks of the calling kernel, so functions defined in a notebook work (they travel by
value with cloudpickle) and a kernel that touched CUDA is no problem.

Every launcher is a session that keeps one contract, ``RunSession`` (``LiveRunSession`` adds
the calls of live ranks): the one-shot ``session.Session``, ``live.session.LiveSession`` and
``torchrun.session.TorchrunSession``. ``drive`` is the one sequence a one-shot run goes
through, whichever session runs it.
"""

from __future__ import annotations

import linecache
import time
from dataclasses import replace
from typing import Protocol, runtime_checkable

from ddp_lab.launch import backends, checks
from ddp_lab.launch.config import LaunchConfig
from ddp_lab.launch.forkserver.client import fork_server_for
from ddp_lab.launch.session import Session
from ddp_lab.launch.verdict.outcome import RunResult, conclude
from ddp_lab.launch.verdict.record import RunRecord
from ddp_lab.launch.verdict.skips import warn_if_skipped


@runtime_checkable
class RunSession(Protocol):
    """One run of ranks, verb by verb. Entering its ``with`` creates nothing, so from then on
    ``close`` runs (``__exit__`` is ``close``) whatever happens: every resource is registered
    for close the moment it is created, with Ctrl-C held back in between (interrupts.py)."""

    def start(self) -> None:
        """Create the run (private folder, rendezvous, output pipes) and start the ranks;
        a one-shot session's one call, its function or script, goes with them. Raises what
        stops a run before its ranks run (a fork server that died or stopped answering, a
        placement that cannot be built); whatever it made is still closed by ``close``."""

    def wait(self) -> object:
        """Stream the ranks' output to the cell until the call is over: every rank exited
        (one-shot), or replied, failed, died or hung (live), enforcing the call's timeout and
        the grace after a first failure. A rank's failure does not raise here (``record``
        says it); a fork server that stops answering does (``ForkServerUnresponsive``)."""

    def record(self) -> RunRecord:
        """The finished call for ``outcome.conclude``: how each rank ended, its output, its
        value and failure records (in the run folder, or held in memory). Call it before
        ``close``, which removes the run folder."""

    def close(self) -> None:
        """Kill every rank still running and remove all the run made (processes, pipes,
        folder, network); nothing is left. Ctrl-C is held back until it is done, then
        raised. Bounded whatever the ranks do: a fork server or torchrun agent that does not
        stop is killed with its ranks."""

    def __enter__(self): ...

    def __exit__(self, *exc) -> None: ...


@runtime_checkable
class LiveRunSession(RunSession, Protocol):
    """Live ranks: ``start`` makes call 0 (each rank replies once its group is up), which
    ``wait`` awaits and returns; then any number of ``call`` + ``wait``. A one-shot
    session's one call is the implicit one its ``start`` makes."""

    def call(self, kind: str, bodies: dict[int, object], timeout: float) -> object:
        """Send ``bodies[rank]`` to each rank in it (``wait`` then awaits the replies).
        Raises RuntimeError once the ranks are lost (a rank died: restart). Ctrl-C here or
        in ``wait`` is the stop button: SIGINT to the call's ranks still in it, then raised."""


def drive(session: RunSession) -> RunResult:
    """A one-shot run from start to result: start, wait, the verdict on ``record()``
    (``outcome.conclude``: the values, or the error that explains why there are none),
    close. ``api.launch`` (run, run_script, spawn) and torchrun's ``run_script`` use it."""
    __tracebackhide__ = True
    with session:
        session.start()
        session.wait()
        return conclude(session.record())


def run(fn, world_size: int = 4, args=(), kwargs=None, backend: str = "auto",
        timeout: float = 60.0, env=None, *, echo: bool = True, network=None, hosts=None,
        nproc_per_node=None, via: str = "ssh", controller=None) -> RunResult:
    """Call ``fn(*args, **kwargs)`` on ``world_size`` ranks with the process group ready.

    Each rank's output is printed live as ``[rank N] ...`` (``echo=False`` keeps it only in
    ``.logs``). Returns a RunResult; raises WorkerError if a rank fails and WorkerTimeout if
    the ranks are still running after ``timeout`` seconds. ``network=Network("1gbit")``
    (or just ``"1gbit"``) gives every rank a shaped link of its own (network/setting.py).
    ``hosts=["node0", "node1"]`` runs ``nproc_per_node`` ranks on each of them instead, an
    agent per host started ``via`` ssh, slurm or a template (``ddp_lab.Ranks`` says more).
    """
    __tracebackhide__ = True  # IPython shows the error, not the launcher's frames
    called = time.monotonic()  # res.seconds: the call's wall time
    checks.check_callable(fn)
    on_hosts = None if hosts is None else (hosts, nproc_per_node, via, controller)
    config = checks.checked_config(world_size, backend, timeout, env, echo=echo,
                                   network=network, hosts=on_hosts)
    args, kwargs = checks.check_call_args(args, kwargs)
    payload = pickle_payload(fn, args, kwargs)
    checks.check_signature(fn, args, kwargs, RUN_CALL_ADVICE)
    if hosts is not None:
        from ddp_lab.launch.remote.one_shot import run_on_hosts
        return run_on_hosts(hosts_config(config), payload)
    return launch(config, payload, called)


RUN_CALL_ADVICE = (
    "ddp_lab.run calls fn(*args, **kwargs) on every rank with the default process group "
    "already initialized (the rank is dist.get_rank()). A function written for "
    "torch.multiprocessing.spawn, fn(rank, ...) that sets MASTER_ADDR/MASTER_PORT and calls "
    "init_process_group itself, runs unchanged with ddp_lab.spawn(fn, args=(world_size,), "
    "nprocs=world_size).")


def run_script(script, world_size: int = 2, script_args=(), backend: str = "auto",
               timeout: float = 300.0, env=None, *, echo: bool = True,
               launcher: str = "ddp_lab", network=None) -> RunResult:
    """Run a torchrun-compatible script (``init_process_group(init_method="env://")``) on
    ``world_size`` ranks. ``ddp_lab.report(value)`` in the script sets ``values[rank]``.

    ``launcher="torchrun"`` starts the ranks with torch's own elastic agent
    (``torchrun --standalone``) instead of ddp_lab's fork server: slower to start, the
    exact torchrun environment, and the same output, errors and cleanup. ``network=``
    as in ``run`` (with the ddp_lab launcher)."""
    __tracebackhide__ = True
    called = time.monotonic()
    launcher = checks.check_launcher(launcher)
    config = checks.checked_config(world_size, backend, timeout, env, echo=echo,
                                   network=network, script=(script, script_args))
    config.placement.allow(config.backend, launcher)
    if launcher == "torchrun":
        from ddp_lab.launch.torchrun.session import TorchrunSession
        _check_machine(config)
        return warn_if_skipped(drive(TorchrunSession(_resolved(config))), stacklevel=3)
    return launch(config, None, called)


def pickle_payload(fn, args: tuple, kwargs: dict, sources: dict | None = None) -> bytes:
    """fn and its arguments as bytes, or a TypeError that says which part cannot travel.
    ``sources``: the cells to ship for tracebacks (default: all of them)."""
    import cloudpickle

    from ddp_lab.launch.payload import dumps
    try:
        return dumps((fn, args, kwargs, interactive_sources() if sources is None else sources))
    except Exception:  # noqa: BLE001 - pickling fails in many ways; find the culprit
        pass
    for what, obj in (("fn", fn), ("args", args), ("kwargs", kwargs)):
        try:
            cloudpickle.dumps(obj)
        except Exception as exc:  # noqa: BLE001
            raise TypeError(
                f"{what} cannot be sent to the ranks ({type(exc).__name__}: {exc}). Every "
                "rank is a separate process, so fn and its arguments are pickled: pass plain "
                "data (numbers, strings, lists, dicts, CPU tensors) and create locks, open "
                "files, sockets or generators inside fn instead.") from exc
    raise TypeError("fn and its arguments cannot be pickled together; pass plain data")


def interactive_sources() -> dict:
    """Source of notebook cells (linecache entries with no file behind them), so that a
    rank's traceback can quote the cell line that failed."""
    return {name: entry for name, entry in list(linecache.cache.items())
            if len(entry) == 4 and entry[1] is None}


def launch(config: LaunchConfig, payload: bytes | None, called: float | None = None) -> RunResult:
    """A checked config (and fn's payload; None for a script) from start to result: what
    run, run_script and the mp.spawn drop-in share. ``called``: when the call began
    (time.monotonic()), which ``res.seconds`` counts from; None: now."""
    __tracebackhide__ = True
    called = time.monotonic() if called is None else called
    return warn_if_skipped(drive(Session(prepare(config), payload, called)))


def prepare(config: LaunchConfig) -> LaunchConfig:
    """The last checks before ranks start (GPUs, this machine's limits), the fork server
    on its way, and the backend resolved: the config the ranks get (live ranks too)."""
    _check_machine(config)
    fork_server_for(config.placement)  # it imports torch while this resolves the backend
    return _resolved(config)


def hosts_config(config: LaunchConfig) -> LaunchConfig:
    """The config ranks on other hosts get: "auto" there is gloo (this machine's GPUs say
    nothing of theirs; give backend="nccl" for hosts with a GPU per rank)."""
    return replace(config, backend="gloo" if config.backend == backends.AUTO else config.backend)


def _check_machine(config: LaunchConfig) -> None:
    """Whether this machine can hold the run: its GPUs (for NCCL) and its limits."""
    if backends.uses_nccl(config.backend):  # else torch is imported later, in parallel
        checks.check_gpus(config.backend, config.world_size, backends.gpu_count())
    checks.check_resources(config.world_size)


def _resolved(config: LaunchConfig) -> LaunchConfig:
    """The backend the ranks get where the run is placed (torchrun's too: no fork server)."""
    backend = resolve_backend(config.backend, config.world_size)
    return replace(config, backend=config.placement.run_backend(backend))


def resolve_backend(backend: str, world_size: int) -> str:
    """'auto' on this machine: "cpu:gloo,cuda:nccl" with a GPU per rank, else "gloo"
    (backends.py says how such a group behaves)."""
    if backend != backends.AUTO:
        return backend  # without importing torch here
    import torch.distributed as dist
    return backends.resolve_backend(backend, world_size, backends.gpu_count(),
                                    dist.is_nccl_available())
