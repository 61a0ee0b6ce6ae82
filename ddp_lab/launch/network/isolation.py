"""Every run's network private to its user: the processes of a run (the fork server and its
ranks, torchrun's agents and their workers) live in a network namespace of their own, with
only a loopback interface, so none of their ports exists where another user (or host)
could connect to it. The namespaces are made by a small helper run as a command prefix
(namespaces.py); this module decides when, and says so.

Why a namespace: torch's TCPStore and gloo have no authentication (PyTorch's SECURITY.md,
"Using distributed features"), and binding to 127.0.0.1 keeps out other machines but not
the other users of this one, who can list the store's keys, swap a rank's gloo address and
relay (read, change) its tensors; torchrun's store even listens on all interfaces and
unpickles what it holds. A port that does not exist in the machine's namespace cannot be
reached at all.

``DDP_LAB_ISOLATION`` chooses: ``auto`` (the default: private where the system allows it,
else one warning and the machine's loopback), ``strict`` (refuse to run without a private
network), ``off`` (the machine's network: for a rank that must reach another machine or a
service).
"""

from __future__ import annotations

import functools
import os
import subprocess
import sys
import warnings

from ddp_lab.launch.network import namespaces

MODE_VAR = "DDP_LAB_ISOLATION"
MODES = ("auto", "strict", "off")
PROBE_TIMEOUT_S = 20.0


class IsolationUnavailable(RuntimeError):
    """No private network namespace can be made here; the message says why and what to do."""


class SharedNetworkWarning(UserWarning):
    """Runs fall back to the machine's loopback, which other local users can reach."""


def mode(env=None) -> str:
    """``DDP_LAB_ISOLATION`` (``auto`` when unset), checked."""
    value = (env if env is not None else os.environ).get(MODE_VAR, "auto").strip().lower()
    if value not in MODES:
        raise ValueError(f"{MODE_VAR}={value!r} is not one of {', '.join(MODES)}: auto (the "
                         "default) keeps each run in a private network where the system "
                         "allows it, strict refuses to run otherwise, off uses the "
                         "machine's network")
    return value


def helper_command(*options: str) -> list[str]:
    """The command that runs the namespace helper (namespaces.py) with ``options``."""
    return [sys.executable, "-I", "-S", os.path.abspath(namespaces.__file__), *options]


@functools.cache
def probe() -> str | None:
    """None if a private namespace can be made here, else why not (one try per process:
    the answer does not change while it runs)."""
    if not sys.platform.startswith("linux"):
        return "network namespaces are a Linux feature"
    try:
        done = subprocess.run(helper_command("--probe"), capture_output=True, text=True,
                              timeout=PROBE_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"the namespace helper did not run: {exc}"
    return None if done.returncode == 0 else (done.stderr.strip() or f"exit {done.returncode}")


def private(wildcard: bool = False) -> bool:
    """Whether a run's processes go into a private namespace: True where they can; False
    with ``off``, or where the system refuses (after one warning); raises with ``strict``.
    ``wildcard``: the processes listen on every interface (torchrun's store, the rank 0 of
    a torch.multiprocessing script), where the machine's network is refused unless ``off``
    says so: anyone who reaches such a store runs code as its owner."""
    chosen = mode()
    if chosen == "off":
        return False
    reason = probe()
    if reason is None:
        return True
    if chosen == "strict":
        raise IsolationUnavailable(
            f"{MODE_VAR}=strict, and no private network can be made here: {reason}. Ask "
            "the administrator to allow unprivileged user namespaces, or unset "
            f"{MODE_VAR} to run on this machine's loopback (where other users of this "
            "machine can reach the run's ports).")
    if wildcard:
        raise IsolationUnavailable(
            f"no private network can be made here ({reason}), and this run would listen on "
            "every interface of this machine: torchrun's rendezvous store (or a "
            "torch.multiprocessing script's rank 0) has no authentication, and torchrun's "
            "agent runs what is written there as code. Allow unprivileged user namespaces, "
            f"or set {MODE_VAR}=off to run it anyway (only where no one you do not trust "
            "can reach this machine).")
    _warn_shared(reason)
    return False


@functools.cache
def _warn_shared(reason: str) -> None:
    """Once per process: the fallback of every later run is the same."""
    warnings.warn(SharedNetworkWarning(
        f"ddp_lab: no private network for this kernel's runs ({reason}); they use this "
        "machine's loopback, where other users of this machine can join them. Fine on a "
        f"laptop of your own; on a shared server, set {MODE_VAR}=strict to refuse "
        "instead."), stacklevel=5)


def prefix(wildcard: bool = False) -> tuple[str, ...]:
    """The command prefix that starts a process in a private namespace of its own, or ()
    (``private``: when, and what it raises)."""
    return (*helper_command(), "--") if private(wildcard) else ()


class PrivateNetwork:
    """One private namespace for several processes that must reach each other on one
    loopback (torchrun agents of a multi-node demo on this machine, a listener and its
    client): nobody else reaches their ports (torchrun's store listens on every interface
    of its namespace, and unpickles what it holds). A ``--hold`` process keeps it until
    ``close``, or until this process dies (the holder's stdin closes); each process joins
    it with ``--join``."""

    def __init__(self):
        self.holder: subprocess.Popen | None = None

    def prefix(self) -> list[str]:
        """The command prefix that puts a process in the namespace ([] with ``off``)."""
        from ddp_lab.launch.interrupts import deferred
        if self.holder is None:
            if not private(wildcard=True):  # torchrun's agents, mostly
                return []
            with deferred():  # a Ctrl-C now would leave a holder nobody closes
                self.holder = subprocess.Popen(helper_command("--hold"),
                                               stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                               stderr=subprocess.PIPE, text=True,
                                               start_new_session=True)
            if self.holder.stdout.readline().strip() != "ready":
                said = self.holder.stderr.read().strip()
                self.close()
                raise IsolationUnavailable("a private network could not be made, though "
                                           f"the probe could: {said}")
        return helper_command("--join", str(self.holder.pid), "--")

    def command(self, host, argv: list[str]) -> list[str]:
        """``argv`` as run on ``host`` (a course ``Host``, or agents.ThisMachine): in this
        private network when the host is this machine's network (its ``netns`` is None)."""
        where = self.prefix() if host.netns is None else []
        return [*where, *host.command(argv)]

    def __enter__(self) -> "PrivateNetwork":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        """End the holder (the namespace goes when the last agent inside it is gone)."""
        holder, self.holder = self.holder, None
        if holder is not None:
            holder.stdin.close()
            holder.wait()
            holder.stdout.close()
            holder.stderr.close()


def describe() -> str:
    """One line for ``ddp-lab doctor``: where this machine's runs live."""
    chosen = mode()
    if chosen == "off":
        return f"{MODE_VAR}=off: runs use this machine's network (other users can reach them)"
    reason = probe()
    if reason is None:
        return f"private: each run in a network namespace of its own ({MODE_VAR}={chosen})"
    refused = "runs are refused" if chosen == "strict" else \
        "runs fall back to this machine's loopback, which other users can reach"
    return f"not private ({reason}): {refused} ({MODE_VAR}={chosen})"
