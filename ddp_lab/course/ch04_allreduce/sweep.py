"""Notebook 04's bandwidth lab: all-reduce time against message size and world size.

Every algorithm of ``allreduce`` and gloo's own ``dist.all_reduce`` is timed the way
nccl-tests times a collective (https://github.com/NVIDIA/nccl-tests, src/common.cu): warm-up
calls first, a barrier, then ``repeats`` calls back to back and the mean time per call,
averaged over the ranks (nccl-tests' default ``-a 1``). One deviation, for shared cores:
nccl-tests times one such burst per size, we time ``bursts`` of them and keep the fastest
(noise from other work only ever adds time). algbw = size / time; busbw = algbw *
2(N-1)/N, the bandwidth each link needed, comparable across N. A latency-bandwidth
(alpha-beta) model t = alpha + beta * size is fitted to each curve.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from ddp_lab.course.alpha_beta import AlphaBeta, fit_alpha_beta
from ddp_lab.course.ch04_allreduce.allreduce import ALGORITHMS, Link
from ddp_lab.course.units import MiB


@dataclass(frozen=True)
class SweepConfig:
    """Sizes in bytes of float32 tensors (1 KiB to 64 MiB by default), the algorithms to
    time ("gloo" is the built-in), back-to-back calls per timed burst (nccl-tests' ``-n``),
    timed bursts per size, warm-up calls (nccl-tests' ``-w``), and OpenMP threads per
    rank: 1 keeps N ranks from fighting over 2 cores; more oversubscribes them on purpose."""

    sizes: tuple[int, ...] = tuple(1024 * 4 ** k for k in range(9))
    algorithms: tuple[str, ...] = ("reduce_broadcast", "whole_ring", "ring",
                                   "halving_doubling", "gloo")
    repeats: int = 20
    large_repeats: int = 5   # sizes from 4 MiB up: each call takes long enough
    bursts: int = 3
    warmup: int = 2
    threads: int = 1


def _builtin(tensor, group=None, link=None):
    dist.all_reduce(tensor, group=group)
    return tensor


def _fits(name: str, world: int) -> bool:
    return name != "halving_doubling" or not world & (world - 1)


def time_sweep(config: SweepConfig = SweepConfig()) -> dict:
    """On each rank: time every (algorithm, size); returns {"seconds": {algo: {size:
    [mean time per call of each burst, averaged over ranks]}}, "bytes": {algo: {size:
    [bytes sent per call, per rank]}}}."""
    threads = torch.get_num_threads()
    torch.set_num_threads(config.threads)
    try:
        world = dist.get_world_size()
        names = [a for a in config.algorithms if _fits(a, world)]
        mine = {}
        for size in config.sizes:
            mine.update(_time_size(names, size, config))
    finally:
        torch.set_num_threads(threads)
    return _combine(mine, names, config.sizes)


def _time_size(names: list, size: int, config: SweepConfig) -> dict:
    """Bursts go round the algorithms in turn, so a burst of load from elsewhere on the
    machine slows one burst of each rather than every burst of one."""
    tensor = torch.zeros(size // 4, dtype=torch.float32)
    for name in names:
        for _ in range(config.warmup):
            ALGORITHMS.get(name, _builtin)(tensor)
    calls = config.large_repeats if size >= 4 * MiB else config.repeats
    times, links = {n: [] for n in names}, {n: Link() for n in names}
    for _ in range(config.bursts):
        for name in names:
            times[name].append(_burst(ALGORITHMS.get(name, _builtin), tensor, links[name], calls))
    return {(n, size): (times[n], links[n].bytes_sent // (calls * config.bursts)) for n in names}


def _burst(algorithm, tensor: torch.Tensor, link: Link, calls: int) -> float:
    """nccl-tests' timed loop: a barrier so all ranks start together, ``calls`` calls back
    to back (each may start as soon as this rank is done with the last one, as in training),
    the mean per call."""
    dist.barrier()
    start = time.perf_counter()
    for _ in range(calls):
        algorithm(tensor, link=link)
    return (time.perf_counter() - start) / calls


def _combine(mine: dict, names: list, sizes) -> dict:
    """Average each burst's time per call over the ranks (nccl-tests' default, ``-a 1``;
    after a burst of back-to-back collectives the ranks' times differ by little), and
    gather every rank's byte count (outside the timed region)."""
    keys = list(mine)
    flat = torch.tensor([t for k in keys for t in mine[k][0]], dtype=torch.float64)
    dist.all_reduce(flat)
    flat /= dist.get_world_size()
    counts = [None] * dist.get_world_size()
    dist.all_gather_object(counts, [mine[k][1] for k in keys])
    seconds, sent, i = {a: {} for a in names}, {a: {} for a in names}, 0
    for j, (name, size) in enumerate(keys):
        n = len(mine[(name, size)][0])
        seconds[name][size] = flat[i:i + n].tolist()
        sent[name][size] = [c[j] for c in counts]
        i += n
    return {"seconds": seconds, "bytes": sent}


@dataclass(frozen=True)
class Sweep:
    """Measured sweeps by world size: ``runs[n]`` is ``time_sweep``'s result on n ranks."""

    runs: dict = field(default_factory=dict)
    threads: int = 1

    def seconds(self, world: int, algorithm: str, size: int) -> float:
        return min(self.runs[world]["seconds"][algorithm][size])

    def algorithms(self, world: int) -> list[str]:
        return list(self.runs[world]["seconds"])

    def sizes(self, world: int) -> list[int]:
        return sorted(next(iter(self.runs[world]["seconds"].values())))

    def algbw(self, world: int, algorithm: str, size: int) -> float:
        return size / self.seconds(world, algorithm, size)

    def busbw(self, world: int, algorithm: str, size: int) -> float:
        return self.algbw(world, algorithm, size) * 2 * (world - 1) / world

    def bytes_sent(self, world: int, algorithm: str, size: int) -> list[int]:
        return self.runs[world]["bytes"][algorithm][size]

    def fit(self, world: int, algorithm: str) -> AlphaBeta:
        sizes = self.sizes(world)
        return fit_alpha_beta(sizes, [self.seconds(world, algorithm, s) for s in sizes])

    def ratio_to_gloo(self, world: int, algorithm: str, size: int) -> float:
        """How fast the algorithm is relative to gloo's built-in (>1: faster)."""
        return self.seconds(world, "gloo", size) / self.seconds(world, algorithm, size)


def measure_sweep(config: SweepConfig = SweepConfig(), world_sizes=(2, 4),
                  timeout: float = 600.0) -> Sweep:
    import ddp_lab
    runs = {n: ddp_lab.run(time_sweep, world_size=n, args=(config,), timeout=timeout,
                           echo=False).values[0] for n in world_sizes}
    return Sweep(runs, config.threads)
