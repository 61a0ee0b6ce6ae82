"""``ddp_lab.Ranks``: ranks that stay alive across cells, with their namespaces and their
process group, until ``close()``.

    ranks = ddp_lab.Ranks(world_size=4)        # started now, group ready
    ranks.exec("model = torch.nn.Linear(4, 2)")   # each rank's own namespace keeps it
    ranks.run(step, 0.1)                          # a function, defined here or imported
    ranks.pull("model")                           # one value per rank
    ranks.close()                                 # or: with ddp_lab.Ranks(4) as ranks: ...

On several hosts, ``ddp_lab.Ranks(4, hosts=["node0", "node1"], nproc_per_node=2,
via="ssh")`` starts an agent on each host (through ssh, ``via="slurm"`` srun, or a
template of yours) that forks that host's ranks (remote/session.py); every call works the same.

Every call raises what ``ddp_lab.run`` raises for the same failure (``WorkerError``,
``WorkerTimeout``), with ``err.session`` saying what became of the ranks: ``"kept"`` (every
rank answered; namespaces intact), ``"restart"`` (a rank could not be interrupted, or a
process-group operation timed out and left the group of no further use: new ranks were
started, namespaces empty) or ``"stopped"`` (a rank died: ``restart()``).
"""

from __future__ import annotations

import itertools
import weakref

from ddp_lab.launch import checks
from ddp_lab.launch.api import hosts_config, interactive_sources, pickle_payload, prepare
from ddp_lab.launch.live.outcome import verdict
from ddp_lab.launch.live.session import LiveSession
from ddp_lab.launch.network.placement import OnHosts
from ddp_lab.launch.payload import remember_source
from ddp_lab.launch.verdict.outcome import RunResult

_cell_numbers = itertools.count(1)  # names each source uniquely in linecache


class Ranks:
    """Live ranks: ``run``, ``exec``, ``pull``, ``push``, ``restart``, ``close``."""

    def __init__(self, world_size: int = 4, backend: str = "auto", network=None,
                 timeout: float = 60.0, env=None, *, echo: bool = True, hosts=None,
                 nproc_per_node=None, via: str = "ssh", controller=None):
        __tracebackhide__ = True
        on_hosts = None if hosts is None else (hosts, nproc_per_node, via, controller)
        self._config = _prepared(checks.checked_config(world_size, backend, timeout, env,
                                                       echo=echo, network=network,
                                                       hosts=on_hosts))
        self._session = None
        self._start()

    # -- the calls ------------------------------------------------------------------------
    def run(self, fn, *args, **kwargs) -> RunResult:
        """``fn(*args, **kwargs)`` on every rank, in its live process."""
        __tracebackhide__ = True
        checks.check_callable(fn)
        checks.check_signature(fn, args, kwargs, "ranks.run(fn, *args, **kwargs) calls "
                               "fn(*args, **kwargs) on every rank")
        body = pickle_payload(fn, args, kwargs, self._new_sources())
        return self._call("run", dict.fromkeys(self._all(), body))

    def exec(self, source: str, on=None, *, timeout: float | None = None) -> RunResult:
        """Run Python ``source`` in each rank's namespace (``torch``, ``dist``, ``rank``,
        ``world_size`` ready), or only on the ranks in ``on``; what it defines stays.
        ``values`` hold each rank's last bare expression, as a cell shows it (else None).
        ``timeout`` (seconds) replaces the session's for this call."""
        __tracebackhide__ = True
        timeout = self._config.timeout if timeout is None else checks.check_timeout(timeout)
        if not isinstance(source, str):
            raise TypeError(f"source must be a string of Python code, got {type(source).__name__}")
        filename = f"<ranks cell {next(_cell_numbers)}>"
        compile(source, filename, "exec")  # a SyntaxError here, not once per rank
        remember_source(filename, source)  # stack reports of a hang quote its lines
        return self._call("exec", dict.fromkeys(self._targets(on), (source, filename)),
                          timeout)

    def pull(self, name: str, on=None) -> list:
        """The value of ``name`` in each rank's namespace (or each rank in ``on``)."""
        __tracebackhide__ = True
        if not isinstance(name, str) or not name.isidentifier():
            raise ValueError(f"name must be a Python name, got {name!r}")
        return self._call("pull", dict.fromkeys(self._targets(on), name)).values

    def push(self, **values) -> None:
        """Set these names in every rank's namespace."""
        __tracebackhide__ = True
        if not values:
            raise TypeError("push needs names to set: ranks.push(lr=0.1, data=tensor)")
        self._call("push", dict.fromkeys(self._all(), _pickled(values)))

    # -- the processes ----------------------------------------------------------------------
    def restart(self) -> None:
        """New processes, a new process group, empty namespaces."""
        self._stop()
        self._start()

    def close(self) -> None:
        """Stop the ranks and remove everything they had; idempotent."""
        self._stop()

    def __enter__(self) -> "Ranks":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    @property
    def world_size(self) -> int:
        return self._config.world_size

    @property
    def state(self) -> str:
        """"ready", "stopped" (a rank died: restart()) or "closed"."""
        if self._session is None:
            return "closed"
        return "stopped" if self._session.lost else "ready"

    def __repr__(self) -> str:
        placement = self._config.placement
        hosts = (f"hosts={list(placement.names)!r}, nproc_per_node={placement.nproc}, "
                 if isinstance(placement, OnHosts) else "")
        return (f"Ranks(world_size={self.world_size}, {hosts}backend={self._config.backend!r}, "
                f"state={self.state!r})")

    # -- inside ---------------------------------------------------------------------------
    def _start(self) -> None:
        __tracebackhide__ = True
        session = _new_session(self._config)
        finalizer = weakref.finalize(self, session.close)
        try:  # the finalizer also runs at the interpreter's exit: a kernel that shuts down
            session.start()
            verdict(session, session.wait())
        except BaseException:
            finalizer()
            raise
        self._session, self._finalizer = session, finalizer
        self._sources_sent: dict[str, int] = {}  # cell file name -> size, as shipped

    def _stop(self) -> None:
        if self._session is not None:
            self._session = None
            self._finalizer()  # session.close, once

    def _call(self, kind: str, bodies: dict, timeout: float | None = None) -> RunResult:
        __tracebackhide__ = True
        if self._session is None:
            raise RuntimeError("these ranks are closed: ranks.restart() starts new ones, or "
                               "make a new ddp_lab.Ranks(...)")
        try:
            self._session.call(kind, bodies, timeout or self._config.timeout)
            call = self._session.wait()
        except KeyboardInterrupt:
            self._restart_after_interrupt()
            raise
        try:
            return verdict(self._session, call)
        except Exception as exc:
            if getattr(exc, "session", None) == "restart":
                self.restart()
            raise

    def _restart_after_interrupt(self) -> None:
        """The stop button, and some rank would not stop (inside a collective): handled as
        a hang, where each waits, then new ranks."""
        if self._session.lost and "did not stop" in self._session.lost:
            print(f"[ddp_lab] {self._session.lost}\n[ddp_lab] the ranks were restarted: a new "
                  "process group, empty namespaces", flush=True)
            self.restart()

    def _new_sources(self) -> dict:
        """The notebook's cells the ranks have not seen yet: live ranks keep the ones they
        got (for tracebacks), so a call ships only what is new, not every cell again."""
        fresh = {name: entry for name, entry in interactive_sources().items()
                 if self._sources_sent.get(name) != entry[0]}
        self._sources_sent.update({name: entry[0] for name, entry in fresh.items()})
        return fresh

    def _all(self) -> list[int]:
        return list(range(self.world_size))

    def _targets(self, on) -> list[int]:
        if on is None:
            return self._all()
        ranks = [on] if isinstance(on, int) else list(on)
        bad = [r for r in ranks if not isinstance(r, int) or not 0 <= r < self.world_size]
        if bad or not ranks:
            raise ValueError(f"on={on!r} must name ranks of these {self.world_size} live "
                             f"ranks (0 to {self.world_size - 1})")
        return sorted(set(ranks))


def _prepared(config):
    """The config the ranks get: this machine's checks, or the hosts' (api.py)."""
    return hosts_config(config) if isinstance(config.placement, OnHosts) else prepare(config)


def _new_session(config):
    if isinstance(config.placement, OnHosts):
        from ddp_lab.launch.remote.session import RemoteSession
        return RemoteSession(config)
    return LiveSession(config)


def _pickled(values: dict) -> bytes:
    """By value (a notebook's classes travel too), once for every rank; a TypeError that
    names the value that cannot travel, before anything is sent."""
    from ddp_lab.launch.payload import dumps
    for name, value in values.items():
        try:
            dumps(value)
        except Exception as exc:  # noqa: BLE001 - pickling fails in many ways
            raise TypeError(f"{name} cannot be sent to the ranks ({type(exc).__name__}: "
                            f"{exc}); push plain data: numbers, strings, lists, dicts, "
                            "tensors") from exc
    return dumps(values)
