"""``ddp-lab bench ranks --hosts``: the round trip of a call to live ranks on two hosts
reached through ssh (the ssh test bed, ``course/ssh_hosts``), against the same number of
live ranks on this machine and against ipyparallel's engines started on the same hosts
through the same ssh, all measured in one run, call after call in turn.

The calls and their timing are ``bench_ranks``' (a trivial call, one all_reduce of one
float timed by the ranks themselves), and so is the record (``RoundTrips``: its
"ddp_lab.Ranks" is the ranks on the hosts, its "ipyparallel" the engines on the hosts).
The targets: the cross-host trivial call within 3x of the local one, and at least 5x
faster than ipyparallel's (trivial, and the all_reduce call less its collective).
"""

from __future__ import annotations

import contextlib
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import ddp_lab
from ddp_lab.tools.bench_ranks import (_GLOO_GROUP, CALLS, RoundTrips, _time_alternating,
                                       all_reduce_one, call_rows, trivial)

LOCAL = "ddp_lab.Ranks local"
HOSTS = "ddp_lab.Ranks"       # on the hosts: RoundTrips' speed-ups are against it
ENGINES = "ipyparallel"       # on the same hosts
PEERS = (LOCAL, HOSTS, ENGINES)
LABELS = {LOCAL: "Ranks, this machine", HOSTS: "Ranks on hosts", ENGINES: "ipyparallel on hosts"}
TARGET_LOCAL_RATIO = 3.0      # the cross-host trivial call at most this many times the local
TARGET_SPEEDUP = 5.0          # at least this many times faster than ipyparallel per call
ENGINES_START_S = 120.0       # every engine registered with the controller within this
# (about 10 s for 4 on 2 loaded cores: each imports IPython's kernel and zmq)
RANK_VARIABLE = "DDP_LAB_BENCH_RANK"  # an engine's rank in the gloo group (host 0's first)


@contextlib.contextmanager
def ipyparallel_on_hosts(bed, per_host: int = 2):
    """ipyparallel's engines, ``per_host`` on each host of ``bed`` started through its ssh,
    joined in one gloo group in rank order (host 0's engines first); yields a callable
    ``fn -> list of values`` (one per engine, in rank order). The controller runs here and
    listens on the link's address (``bed.machine``), never on every interface (its
    broadcast schedulers' links among themselves are on 127.0.0.1, hard-coded in
    ipyparallel's controller/app.py); the connection file, the profile and the group's
    FileStore live in a private (0700) folder on the files the hosts share. Everything is stopped on the way out (engines,
    ssh clients, controller, folder), whatever ended the body, Ctrl-C included."""
    import ipyparallel

    from ddp_lab.launch.interrupts import deferred
    folder = Path(tempfile.mkdtemp(prefix="ddp_lab_bench_hosts-"))  # 0700
    started: list[tuple[subprocess.Popen, Path]] = []  # each engine's ssh and pid file
    cluster = client = None
    try:
        with deferred():  # a controller started is a controller recorded
            cluster = ipyparallel.Cluster(controller_ip=bed.machine, n=0, log_level=40,
                                          profile_dir=str(folder / "profile"))
            cluster.start_controller_sync()
        client = cluster.connect_client_sync()  # waits for the connection files
        _start_engines(bed, per_host, folder, cluster.controller.connection_files["engine"],
                       started)
        view = _ranked_view(client, started)
        view.execute(_GLOO_GROUP.format(path=folder / "store", world_size=len(view)))
        yield view.apply_sync
        view.execute("dist.destroy_process_group()")
    finally:
        with deferred():  # a Ctrl-C during the cleanup waits for its end
            _stop(started, client, cluster)
            shutil.rmtree(folder, ignore_errors=True)


def _start_engines(bed, per_host: int, folder: Path, connection: str,
                   started: list) -> None:
    """One engine per rank through ``ssh``, each printing to a log in ``folder``."""
    from ddp_lab.launch.interrupts import deferred
    for index, host in enumerate(bed.hosts):
        for rank in range(index * per_host, (index + 1) * per_host):
            pid_file = folder / f"engine-{rank}.pid"
            argv = _engine_argv(host, rank, folder, connection, pid_file)
            with open(pid_file.with_suffix(".log"), "wb") as out, deferred():
                started.append((subprocess.Popen(  # an ssh started is an ssh recorded
                    bed.command(host, argv), stdin=subprocess.DEVNULL, stdout=out,
                    stderr=out, start_new_session=True), pid_file))


def _engine_argv(host, rank: int, folder: Path, connection: str, pid_file: Path) -> list:
    """``python -m ipyparallel.engine`` with this venv's python and this checkout on
    PYTHONPATH (the hosts share this machine's files), gloo on the host's interface (its
    hostname resolves to loopback, as on a cluster), after its shell wrote its pid."""
    return ["sh", "-c", 'echo $$ > "$0.new" && mv "$0.new" "$0" && exec "$@"', str(pid_file),
            "env", f"PYTHONPATH={_checkout()}", f"GLOO_SOCKET_IFNAME={host.interface}",
            f"IPYTHONDIR={folder / 'ipython'}", f"{RANK_VARIABLE}={rank}",
            sys.executable, "-m", "ipyparallel.engine", f"--file={connection}",
            f"--profile-dir={folder / 'profile'}", "--log-level=40"]


def _checkout() -> str:
    """The folder that holds this ``ddp_lab`` package: what the engines import it from."""
    import ddp_lab
    return str(Path(ddp_lab.__file__).resolve().parents[1])


def _ranked_view(client, started: list):
    """A blocking view of every engine in rank order, once all have registered (the hub
    numbers engines in the order they arrive, which is not the ranks' order)."""
    _wait_for_engines(client, started)
    view = client[:]
    ranks = view.apply_sync(_engine_rank)
    view = client[[engine for _, engine in sorted(zip(ranks, client.ids))]]
    view.block = True
    view.execute(f"import os; rank = int(os.environ[{RANK_VARIABLE!r}])")
    return view


def _wait_for_engines(client, started: list) -> None:
    """Until every engine has registered; an engine whose ssh ended, or a start past
    ENGINES_START_S, raises with what the engines printed (a missing module, a refused
    login, an unreachable controller)."""
    deadline = time.monotonic() + ENGINES_START_S
    while len(client.ids) < len(started):
        ended = [ssh for ssh, _ in started if ssh.poll() is not None]
        if ended or time.monotonic() > deadline:
            logs = "\n".join(f"--- {pid_file.stem}:\n{_tail(pid_file.with_suffix('.log'))}"
                             for _, pid_file in started)
            raise RuntimeError(f"{len(client.ids)} of {len(started)} ipyparallel engines "
                               f"registered ({len(ended)} ended); what they printed:\n{logs}")
        time.sleep(0.1)


def _tail(path: Path, chars: int = 2000) -> str:
    return path.read_text(errors="replace")[-chars:] if path.exists() else "(nothing)"


def _engine_rank() -> int:
    import os
    return int(os.environ["DDP_LAB_BENCH_RANK"])


def _stop(started: list, client, cluster) -> None:
    """Kill every engine (with its nanny), wait for its ssh, then the client and the
    controller; every step runs even if an earlier one failed."""
    from ddp_lab.launch.forkserver.process_tree import kill_tree
    try:
        for ssh, pid_file in started:
            pid = _engine_pid(ssh, pid_file)
            if pid is not None:
                kill_tree(pid)
        for ssh, _ in started:
            try:
                ssh.wait(timeout=10)  # its remote command is gone: ssh ends
            except subprocess.TimeoutExpired:
                kill_tree(ssh.pid)
                ssh.wait()
    finally:
        try:
            if client is not None:
                client.close()
        finally:
            if cluster is not None:
                cluster.stop_cluster_sync()


def _engine_pid(ssh: subprocess.Popen, pid_file: Path) -> int | None:
    """The engine's pid, once its shell has written it (renamed into place: never half
    written); None if its ssh ended first (the engine never started, or ended)."""
    deadline = time.monotonic() + ENGINES_START_S
    while not pid_file.exists():
        if ssh.poll() is not None or time.monotonic() > deadline:
            return None
        time.sleep(0.02)
    return int(pid_file.read_text())


@contextlib.contextmanager
def ranks_on_hosts(bed, per_host: int):
    """``ddp_lab.Ranks`` on the bed's hosts, ``per_host`` each, reached through its ssh."""
    with ddp_lab.Ranks(per_host * len(bed.hosts), backend="gloo", echo=False,
                       hosts=[host.name for host in bed.hosts], nproc_per_node=per_host,
                       via=bed.via, controller=bed.machine) as ranks:
        yield lambda fn: ranks.run(fn).values


def measure_hosts(bed, per_host: int = 2, repeats: int = 100) -> RoundTrips:
    """Every peer's calls in one run, alternating call by call (``_time_alternating``)."""
    from ddp_lab.tools.bench_ranks import live_ranks
    trips = RoundTrips(per_host * len(bed.hosts))
    with live_ranks(trips.world_size) as local, ranks_on_hosts(bed, per_host) as hosts, \
            ipyparallel_on_hosts(bed, per_host) as engines:
        for call, fn in zip(CALLS, (trivial, all_reduce_one)):
            peers = {LOCAL: lambda: local(fn), HOSTS: lambda: hosts(fn),
                     ENGINES: lambda: engines(fn)}
            times, values = _time_alternating(peers, repeats)
            for peer in peers:
                trips.ms[peer, call] = times[peer]
                if fn is all_reduce_one:
                    trips.collective_ms[peer] = [max(per_rank) for per_rank in values[peer]]
    return trips


def local_ratio(trips: RoundTrips) -> float:
    """The cross-host trivial call's median over the local one's."""
    return trips.median(HOSTS, "trivial") / trips.median(LOCAL, "trivial")


def format_report(trips: RoundTrips, hosts: int) -> str:
    per_host = trips.world_size // hosts
    lines = [f"round trip of one call to {trips.world_size} ranks ({per_host} on each of "
             f"{hosts} hosts through ssh; median ms)",
             *call_rows(trips, PEERS, LABELS, "ipyparallel / hosts", _mark, width=22)]
    collectives = ", ".join(f"{LABELS[p]} {trips.own_cost(p):.3f}" for p in PEERS)
    ratio = local_ratio(trips)
    lines += ["", f"the all_reduce call less its collective (median ms): {collectives}; "
                  f"ipyparallel / hosts {trips.own_speedup():.1f}x (no target: ipyparallel "
                  "sends the call to its engines in turn, so its first engine waits inside "
                  "the collective for the last, and its collective's time holds some of its "
                  "call's)",
              f"the trivial call on the hosts takes {ratio:.1f}x the local one"
              + ("" if ratio <= TARGET_LOCAL_RATIO else
                 f"  MISSED (target <= {TARGET_LOCAL_RATIO:g}x of the local call)")]
    return "\n".join(lines)


def _mark(speedup: float, what: str) -> str:
    return "" if speedup >= TARGET_SPEEDUP else f"  MISSED (target {TARGET_SPEEDUP:g}x: {what})"


def missed(trips: RoundTrips) -> bool:
    """The targets are on the call itself, the trivial one (see format_report)."""
    return trips.speedup("trivial") < TARGET_SPEEDUP or local_ratio(trips) > TARGET_LOCAL_RATIO


def refusal(per_host: int = 2, repeats: int = 100) -> str | None:
    """Why the bench cannot run here (one line, with what to install or do), or None."""
    for name, value in (("--per-host", per_host), ("--repeats", repeats)):
        if not isinstance(value, int) or value < 1:
            return f"ddp-lab bench ranks --hosts: {name} {value!r}: give a positive integer"
    try:
        import ipyparallel  # noqa: F401 - checked before anything starts
    except ImportError:
        return ("ddp-lab bench ranks --hosts compares with ipyparallel: pip install "
                "ipyparallel (a benchmark-only extra: pip install -e '.[bench]')")
    from ddp_lab.course.ssh_hosts import ssh_support
    reason = ssh_support()
    if reason:
        return f"ddp-lab bench ranks --hosts needs the ssh test bed, which cannot start: {reason}"
    return None


def main(per_host: int = 2, repeats: int = 100) -> int:
    reason = refusal(per_host, repeats)
    if reason:
        print(reason, file=sys.stderr)
        return 2
    from ddp_lab.course.ssh_hosts import ssh_hosts
    print(f"measuring {repeats} calls of each kind on two ssh hosts, {per_host} ranks each: "
          "local ranks, ranks on the hosts and ipyparallel in turn ...", flush=True)
    with ssh_hosts(count=2) as bed:
        trips = measure_hosts(bed, per_host, repeats)
    print("\n" + format_report(trips, hosts=2))
    if missed(trips):
        print("ddp-lab bench ranks --hosts: a target was MISSED (see above); on a loaded "
              "machine run it again when it is quiet", file=sys.stderr)
        return 1
    return 0
