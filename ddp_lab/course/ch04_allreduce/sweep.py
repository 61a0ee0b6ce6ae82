"""Notebook 04's bandwidth lab: all-reduce time against message size and world size.

Every algorithm of ``allreduce`` and gloo's own ``dist.all_reduce`` is timed the way
nccl-tests does it: warm-up calls first, a barrier before every timed call, the slowest
rank's time as the collective's time, the fastest of a few repeats as the estimate (noise
on shared cores only ever adds time). algbw = size / time; busbw = algbw * 2(N-1)/N, the
bandwidth each link needed, comparable across N. A latency-bandwidth (alpha-beta) model
t = alpha + beta * size is fitted to each curve.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from ddp_lab.course.ch04_allreduce.allreduce import ALGORITHMS, Link
from ddp_lab.course.units import MiB


@dataclass(frozen=True)
class SweepConfig:
    """Sizes in bytes of float32 tensors (1 KiB to 64 MiB by default), the algorithms to
    time ("gloo" is the built-in), repeats per size, and OpenMP threads per rank: 1 keeps
    N ranks from fighting over 2 cores; more oversubscribes them on purpose."""

    sizes: tuple[int, ...] = tuple(1024 * 4 ** k for k in range(9))
    algorithms: tuple[str, ...] = ("reduce_broadcast", "whole_ring", "ring",
                                   "halving_doubling", "gloo")
    repeats: int = 20
    large_repeats: int = 5   # sizes from 4 MiB up: each call takes long enough
    warmup: int = 2
    threads: int = 1


def _builtin(tensor, group=None, link=None):
    dist.all_reduce(tensor, group=group)
    return tensor


def _fits(name: str, world: int) -> bool:
    return name != "halving_doubling" or not world & (world - 1)


def time_sweep(config: SweepConfig = SweepConfig()) -> dict:
    """On each rank: time every (algorithm, size); returns {"seconds": {algo: {size:
    [slowest rank's time per repeat]}}, "bytes": {algo: {size: [bytes sent per rank]}}}."""
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
    """Repeats go round the algorithms in turn, so a burst of load from elsewhere on the
    machine slows one repeat of each rather than every repeat of one."""
    tensor = torch.zeros(size // 4, dtype=torch.float32)
    for name in names:
        for _ in range(config.warmup):
            ALGORITHMS.get(name, _builtin)(tensor)
    times, links = {n: [] for n in names}, {n: Link() for n in names}
    for _ in range(config.large_repeats if size >= 4 * MiB else config.repeats):
        for name in names:
            dist.barrier()
            start = time.perf_counter()
            ALGORITHMS.get(name, _builtin)(tensor, link=links[name])
            times[name].append(time.perf_counter() - start)
    return {(n, size): (times[n], links[n].bytes_sent // len(times[n])) for n in names}


def _combine(mine: dict, names: list, sizes) -> dict:
    """The collective ends when its slowest rank does: take the max over ranks per repeat,
    and gather every rank's byte count (outside the timed region)."""
    keys = list(mine)
    flat = torch.tensor([t for k in keys for t in mine[k][0]], dtype=torch.float64)
    dist.all_reduce(flat, op=dist.ReduceOp.MAX)
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
class AlphaBeta:
    """t(size) = alpha + beta * size, fitted by least squares on relative error (so 1 KiB
    counts as much as 64 MiB); r2 is the coefficient of determination of log t."""

    alpha: float
    beta: float
    r2: float
    max_rel_error: float

    def predict(self, size: float) -> float:
        return self.alpha + self.beta * size


def fit_alpha_beta(sizes, seconds) -> AlphaBeta:
    a = torch.tensor([[1.0 / t, s / t] for s, t in zip(sizes, seconds)], dtype=torch.float64)
    alpha, beta = torch.linalg.lstsq(a, torch.ones(len(sizes), 1, dtype=torch.float64)
                                     ).solution.flatten().tolist()
    predicted = [max(alpha + beta * s, 1e-12) for s in sizes]
    logs, fit_logs = [math.log(t) for t in seconds], [math.log(p) for p in predicted]
    mean = sum(logs) / len(logs)
    total = sum((x - mean) ** 2 for x in logs) or 1.0
    r2 = 1 - sum((x - y) ** 2 for x, y in zip(logs, fit_logs)) / total
    rel = max(abs(p - t) / t for p, t in zip(predicted, seconds))
    return AlphaBeta(alpha, beta, r2, rel)


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
