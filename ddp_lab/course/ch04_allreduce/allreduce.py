"""Notebook 04: all-reduce built from nothing but send/recv/isend/irecv.

Four algorithms, each summing ``tensor`` in place across the group like ``dist.all_reduce``:
reduce to a root then broadcast, the whole-tensor ring of the original PyTorch tutorial,
the bandwidth-optimal chunked ring (reduce-scatter then all-gather), and recursive
halving/doubling (the ring and ``Link`` live in ``ddp_lab.scratch.ring``, imported here).
Every one talks through a ``Link``, which counts the bytes this rank
sends so the notebook can compare them with the prediction. The timing sweep lives in
``allreduce_bench``.
"""

from __future__ import annotations

import os

import torch
import torch.distributed as dist

# The ring and the Link it talks through are scratch's: the one home of the ring.
from ddp_lab.scratch.ring import (Link, _flat, _ring_phase, _write_back,  # noqa: F401
                                  ring_all_reduce)


def reduce_broadcast(tensor: torch.Tensor, group=None, link: Link | None = None):
    """Everyone sends to rank 0, which adds, then sends the sum back to everyone. Simple,
    but rank 0's link carries (N-1) whole tensors each way: it grows with N."""
    link = link or Link(group)
    flat, root = _flat(tensor), 0
    if link.rank == root:
        incoming = torch.empty_like(flat)
        for peer in range(1, link.world):
            link.recv(incoming, peer)
            flat += incoming
        for peer in range(1, link.world):
            link.send(flat, peer)
    else:
        link.send(flat, root)
        link.recv(flat, root)
    return _write_back(tensor, flat)


def whole_ring(tensor: torch.Tensor, group=None, link: Link | None = None):
    """The original tutorial's ring: pass the whole tensor to the right N-1 times, adding
    what arrives from the left. Each rank sends (N-1) whole tensors."""
    link = link or Link(group)
    flat = _flat(tensor)
    right, left = (link.rank + 1) % link.world, (link.rank - 1) % link.world
    outgoing, incoming = flat.clone(), torch.empty_like(flat)
    for _ in range(link.world - 1):
        link.exchange(outgoing, right, incoming, left)
        flat += incoming
        outgoing, incoming = incoming, outgoing  # pass on what just arrived
    return _write_back(tensor, flat)


def halving_doubling(tensor: torch.Tensor, group=None, link: Link | None = None):
    """Recursive halving then doubling (Rabenseifner) for power-of-two N: exchange half the
    segment with the partner at distance N/2, N/4, ..., 1 (reduce-scatter in log2 N steps),
    then retrace the steps swapping summed halves (all-gather). Same 2(N-1)/N bytes as the
    ring, but log2 N messages per phase instead of N-1 (MPICH uses it for long messages,
    where the bytes dominate; for short ones it uses recursive doubling on the whole
    vector: Thakur, Rabenseifner & Gropp, 2005)."""
    link = link or Link(group)
    if link.world & (link.world - 1):
        raise ValueError(f"halving_doubling needs a power-of-two world size, got {link.world}")
    flat = _flat(tensor)
    scratch = torch.empty((flat.numel() + 1) // 2, dtype=flat.dtype, device=flat.device)
    segments = _halve(link, flat, scratch)
    _double(link, flat, segments)
    return _write_back(tensor, flat)


def _halve(link: Link, flat, scratch) -> list:
    """Reduce-scatter: keep the lower or upper half of the current segment, send the other
    half to the partner and add the partner's copy of ours. Returns the visited segments."""
    lo, hi, segments, distance = 0, flat.numel(), [], link.world // 2
    while distance:
        segments.append((lo, hi, distance))
        mid = lo + (hi - lo) // 2
        keep_low = not link.rank & distance
        (klo, khi), (slo, shi) = ((lo, mid), (mid, hi)) if keep_low else ((mid, hi), (lo, mid))
        incoming = scratch[:khi - klo]
        link.exchange(flat[slo:shi], link.rank ^ distance, incoming, link.rank ^ distance)
        flat[klo:khi] += incoming
        lo, hi, distance = klo, khi, distance // 2
    segments.append((lo, hi, 0))
    return segments


def _double(link: Link, flat, segments: list) -> None:
    """All-gather: walk the segments back up, sending the summed part we own and receiving
    the partner's, which together make the parent segment."""
    (lo, hi, _) = segments[-1]
    for plo, phi, distance in reversed(segments[:-1]):
        other = (hi, phi) if lo == plo else (plo, lo)
        link.exchange(flat[lo:hi], link.rank ^ distance, flat[other[0]:other[1]],
                      link.rank ^ distance)
        lo, hi = plo, phi


ALGORITHMS = {"reduce_broadcast": reduce_broadcast, "whole_ring": whole_ring,
              "ring": ring_all_reduce, "halving_doubling": halving_doubling}


def predicted_bytes(algorithm: str, nbytes: int, world: int) -> list[float]:
    """Bytes each rank sends for one all-reduce of ``nbytes``, by the algorithm's design."""
    if world == 1:
        return [0.0]
    if algorithm == "reduce_broadcast":
        return [float((world - 1) * nbytes)] + [float(nbytes)] * (world - 1)
    if algorithm == "whole_ring":
        return [float((world - 1) * nbytes)] * world
    return [2 * (world - 1) / world * nbytes] * world  # ring, halving_doubling


def _rank_tensor(shape, dtype, seed: int = 0) -> torch.Tensor:
    """Different data on every rank, reproducible by the single-process reference."""
    gen = torch.Generator().manual_seed(seed * 1000 + dist.get_rank())
    if dtype.is_floating_point:
        return torch.randn(shape, generator=gen).to(dtype)
    return torch.randint(-100, 100, shape, generator=gen).to(dtype)


def compare_with_builtin(shape=(10,), dtype=torch.float32, seed: int = 0,
                         transposed: bool = False, device: str = "cpu") -> dict:
    """Run every algorithm that fits this world size on the same data as ``dist.all_reduce``
    and return {name: (result, bytes sent)} plus the built-in's result under "builtin".
    ``device="cuda"``: on this rank's GPU (LOCAL_RANK), for a group that moves CUDA tensors
    through NCCL; results come back on the CPU."""
    if device == "cuda":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
    mine, world, out = _rank_tensor(shape, dtype, seed).to(device), dist.get_world_size(), {}
    for name, algorithm in ALGORITHMS.items():
        if name == "halving_doubling" and world & (world - 1):
            continue
        tensor = mine.clone().t() if transposed else mine.clone()  # t(): not contiguous
        link = Link()
        algorithm(tensor, link=link)
        out[name] = ((tensor.t() if transposed else tensor).cpu(), link.bytes_sent)
    builtin = mine.clone()
    dist.all_reduce(builtin)
    out["builtin"] = (builtin.cpu(), 0)
    return out


def ring_trace(chunk: int = 2) -> list:
    """A real ring all-reduce of a small int64 tensor with rank r holding 10**r everywhere,
    so every element's digits say which ranks it already contains (1011: ranks 0, 1, 3).
    Returns [(phase, step, buffer after the step)], the first entry being the input."""
    rank, world = dist.get_rank(), dist.get_world_size()
    tensor = torch.full((chunk * world,), 10 ** rank, dtype=torch.int64)
    steps = [("input", -1, tensor.clone())]
    ring_all_reduce(tensor, on_step=lambda phase, step, flat: steps.append(
        (phase, step, flat.clone())))
    return steps
