"""Notebook 04 on a network: the bus bandwidth of each all-reduce against the link rate.

With ``ddp_lab.Network`` every rank has one full-duplex link of rate B to a switch (a
network namespace per rank, a veth link shaped by tc tbf both ways). busbw = size / time *
2(N-1)/N is defined so that an algorithm that keeps every link busy in both directions all
the time reaches B whatever N. How close each algorithm comes follows from what crosses
the busiest link (nccl-tests' PERFORMANCE.md explains busbw:
https://github.com/NVIDIA/nccl-tests/blob/master/doc/PERFORMANCE.md):

- ring, halving/doubling: every rank sends and receives 2(N-1)/N of the tensor: B.
- whole-tensor ring: every rank sends the whole tensor N-1 times: 2/N of B.
- reduce + broadcast: the root receives N-1 tensors, then sends N-1 (one link, two
  phases): 1/N of B.
"""

from __future__ import annotations

from ddp_lab.course.ch04_allreduce.sweep import Sweep, SweepConfig, time_sweep
from ddp_lab.course.units import MiB

LINK_CONFIG = SweepConfig(sizes=(2 * MiB,), repeats=3, large_repeats=3, warmup=1)


def predicted_share(algorithm: str, world: int) -> float | None:
    """busbw / link rate when the busiest link is the only limit (None: not predicted)."""
    return {"ring": 1.0, "halving_doubling": 1.0, "whole_ring": 2 / world,
            "reduce_broadcast": 1 / world}.get(algorithm)


def measure_on_link(bandwidth: str = "300mbit", config: SweepConfig = LINK_CONFIG,
                    world_sizes=(2, 4), timeout: float = 120.0) -> Sweep:
    """``time_sweep`` on ``world_sizes`` ranks, each on a link of ``bandwidth``."""
    import ddp_lab
    network = ddp_lab.Network(bandwidth)
    runs = {n: ddp_lab.run(time_sweep, world_size=n, args=(config,), timeout=timeout,
                           network=network, echo=False).values[0] for n in world_sizes}
    return Sweep(runs, config.threads)


def link_shares(sweep: Sweep, bits_per_s: float, size: int) -> dict:
    """{world: {algorithm: measured busbw / link rate}} at message ``size``."""
    return {n: {a: sweep.busbw(n, a, size) * 8 / bits_per_s for a in sweep.algorithms(n)}
            for n in sweep.runs}
