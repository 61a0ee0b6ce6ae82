"""``ddp-lab bench ranks``: the round trip of a call to 4 live ranks, against ipyparallel's
engines holding a gloo group and against a warm ``ddp_lab.run``, measured in one run.

Two calls: a trivial one (the cost of asking every rank and hearing back) and one with a
single ``all_reduce`` of one float. The collective costs the same whoever asked for it
(gloo, between the same processes' sockets): the ranks time it themselves, and the call's
own cost is its round trip less the slowest rank's collective. The targets are on the
calls' own costs. ipyparallel is a benchmark-only extra (``pip install -e '.[bench]'``),
not a dependency of the course.
"""

from __future__ import annotations

import contextlib
import os
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field

TARGET_SPEEDUP = 10.0  # live ranks at least this many times faster per call than ipyparallel
PEERS = ("ddp_lab.Ranks", "ipyparallel", "ddp_lab.run warm")
CALLS = ("trivial", "all_reduce")


def trivial():
    return None


def all_reduce_one() -> float:
    """One all_reduce of one float; returns the milliseconds it took on this rank."""
    import time

    import torch
    import torch.distributed as dist
    t = torch.ones(1)
    start = time.perf_counter()
    dist.all_reduce(t)
    return (time.perf_counter() - start) * 1000


@dataclass
class RoundTrips:
    """Milliseconds of every timed call, by (peer, call)."""

    world_size: int
    ms: dict = field(default_factory=dict)
    collective_ms: dict = field(default_factory=dict)  # peer -> the slowest rank's, per call

    def median(self, peer: str, call: str) -> float:
        return statistics.median(self.ms[peer, call])

    def speedup(self, call: str) -> float:
        return self.median("ipyparallel", call) / self.median("ddp_lab.Ranks", call)

    def own_cost(self, peer: str) -> float:
        """The all_reduce call's median round trip less its collective, call by call."""
        return statistics.median(trip - coll for trip, coll in
                                 zip(self.ms[peer, "all_reduce"], self.collective_ms[peer]))

    def own_speedup(self) -> float:
        return self.own_cost("ipyparallel") / self.own_cost("ddp_lab.Ranks")


def _time_alternating(peers: dict, repeats: int) -> tuple[dict, dict]:
    """Each peer's call timed in turn, round after round, so that a machine whose load
    changes during the benchmark weighs on every peer alike: milliseconds and values."""
    for call in peers.values():
        call()  # warm-up: first calls pay imports and connections
    times = {name: [] for name in peers}
    values = {name: [] for name in peers}
    for _ in range(repeats):
        for name, call in peers.items():
            start = time.perf_counter()
            values[name].append(call())
            times[name].append((time.perf_counter() - start) * 1000)
    return times, values


@contextlib.contextmanager
def live_ranks(world_size: int):
    import ddp_lab
    with ddp_lab.Ranks(world_size, backend="gloo", echo=False) as ranks:
        yield lambda fn: ranks.run(fn).values


@contextlib.contextmanager
def ipyparallel_engines(world_size: int):
    """ipyparallel's engines, one per rank, holding a gloo group as live ranks do. They
    run in the machine's network (ipyparallel's own messages are signed with a key of the
    cluster's), so their group meets in a FileStore in a private folder rather than a
    TCPStore on a port anyone here could reach; their gloo listeners, on loopback, carry
    only this benchmark's tensors."""
    import ipyparallel
    cluster = ipyparallel.Cluster(n=world_size, log_level=40)
    client = cluster.start_and_connect_sync()
    try:
        with tempfile.TemporaryDirectory(prefix="ddp_lab_bench-") as folder:
            view = client[:]
            view.block = True
            view.scatter("rank", list(range(world_size)), flatten=True)
            view.execute(_GLOO_GROUP.format(path=os.path.join(folder, "store"),
                                            world_size=world_size))
            yield view.apply_sync
            view.execute("dist.destroy_process_group()")
    finally:
        client.close()
        cluster.stop_cluster_sync()


_GLOO_GROUP = ("import torch.distributed as dist\n"
               "dist.init_process_group('gloo', init_method='file://{path}', "
               "rank=rank, world_size={world_size})")


def measure(world_size: int, repeats: int) -> RoundTrips:
    import ddp_lab
    trips = RoundTrips(world_size)
    with live_ranks(world_size) as live, ipyparallel_engines(world_size) as engines:
        for call, fn in zip(CALLS, (trivial, all_reduce_one)):
            peers = {"ddp_lab.Ranks": lambda: live(fn), "ipyparallel": lambda: engines(fn)}
            times, values = _time_alternating(peers, repeats)
            for peer in peers:
                trips.ms[peer, call] = times[peer]
                if fn is all_reduce_one:
                    trips.collective_ms[peer] = [max(per_rank) for per_rank in values[peer]]
            # a launch costs ~1,000 times a call: a few of them, after the others
            trips.ms["ddp_lab.run warm", call] = _time_alternating(
                {"run": lambda: ddp_lab.run(fn, world_size, backend="gloo", echo=False)},
                max(3, repeats // 40))[0]["run"]
    return trips


def call_rows(trips: RoundTrips, peers: tuple, labels: dict, ratio_title: str, mark,
              width: int = 20) -> list[str]:
    """Each call's median by peer, and ipyparallel's over live ranks' (``mark``: what a
    missed target adds to the trivial call's row); ``bench ranks --hosts`` shares it."""
    rows = [f"{'call':<12}" + "".join(f"{labels.get(p, p):>{width}}" for p in peers)
            + f"{ratio_title:>{width + 2}}"]
    for call in CALLS:
        rows.append(f"{call:<12}" + "".join(f"{trips.median(p, call):{width}.3f}" for p in peers)
                    + f"{trips.speedup(call):{width + 1}.1f}x"
                    + (mark(trips.speedup(call), call) if call == "trivial" else ""))
    return rows


def format_report(trips: RoundTrips) -> str:
    lines = [f"round trip of one call to {trips.world_size} ranks (median ms; this machine)",
             *call_rows(trips, PEERS, {}, "ipyparallel / live", _mark)]
    live, engines = (statistics.median(trips.collective_ms[p]) for p in PEERS[:2])
    lines += ["", f"the all_reduce itself (slowest rank, median): {live:.3f} ms in live ranks, "
                  f"{engines:.3f} ms in ipyparallel's engines",
              f"the all_reduce call less its collective: {trips.own_cost(PEERS[0]):.3f} ms live, "
              f"{trips.own_cost(PEERS[1]):.3f} ms ipyparallel, {trips.own_speedup():.1f}x"
              + _mark(trips.own_speedup(), "all_reduce call's own cost")]
    return "\n".join(lines)


def _mark(speedup: float, what: str) -> str:
    return "" if speedup >= TARGET_SPEEDUP else f"  MISSED (target {TARGET_SPEEDUP:g}x: {what})"


def missed(trips: RoundTrips) -> bool:
    return min(trips.speedup("trivial"), trips.own_speedup()) < TARGET_SPEEDUP


def main(world_size: int = 4, repeats: int = 200) -> int:
    try:
        import ipyparallel  # noqa: F401 - checked before anything starts
    except ImportError:
        print("ddp-lab bench ranks compares with ipyparallel: pip install ipyparallel "
              "(a benchmark-only extra: pip install -e '.[bench]')", file=sys.stderr)
        return 2
    print(f"measuring {repeats} calls of each kind, live ranks and ipyparallel in turn ...",
          flush=True)
    trips = measure(world_size, repeats)
    print("\n" + format_report(trips))
    if missed(trips):
        print("ddp-lab bench ranks: a target was MISSED (see above); on a loaded machine run "
              "it again when it is quiet", file=sys.stderr)
        return 1
    return 0
