"""Notebook 04's exercises: reduce-scatter and a tree broadcast from send/recv, with the
cost counted.

While the learner's function runs, every collective is switched off and every
point-to-point message is logged (``bytes_sent``): the reduce-scatter must send no more
bytes than the ring's first phase, (N - 1) / N of the tensor per rank; the broadcast must
finish in ceil(log2 N) rounds, a round being one message per rank. The inputs are random
(a fresh seed per check) and the answers are compared with torch's all_reduce/broadcast.
"""

from __future__ import annotations

import math

import torch
import torch.distributed as dist

from ddp_lab.exercises.builtins_off import COLLECTIVES, switched_off
from ddp_lab.exercises.bytes_sent import recording_p2p, rounds
from ddp_lab.exercises.driver import (WORLD_SIZES, generator, new_seed, random_tensor,
                                     run_ranks, tensor_problem)
from ddp_lab.exercises.driver import where as on
from ddp_lab.exercises.registry import Exercise, ExerciseFailed

P2P_ONLY = "build it from send/recv (isend/irecv) only"
DEADLOCK_HINT = ("A blocking send on every rank at once waits forever: post isend and irecv "
                 "together, then wait on both.")


# -- 04.reduce_scatter ----------------------------------------------------------------------
def ring_reduce_scatter(tensor: torch.Tensor) -> torch.Tensor:
    """Reference: the ring's first phase, shifted by one chunk so that rank r ends with
    chunk r. At each of N - 1 steps a rank sends one chunk right and adds the one from the
    left into its own partial sum."""
    rank, world = dist.get_rank(), dist.get_world_size()
    right, left = (rank + 1) % world, (rank - 1) % world
    chunks = [c.clone() for c in tensor.chunk(world)]
    for step in range(world - 1):
        outgoing = chunks[(rank - step - 1) % world]
        into = chunks[(rank - step - 2) % world]
        incoming = torch.empty_like(into)
        for request in (dist.isend(outgoing, right), dist.irecv(incoming, left)):
            request.wait()
        into += incoming
    return chunks[rank]


def _reduce_scatter_trial(fn, seed: int):
    rank, world = dist.get_rank(), dist.get_world_size()
    chunk = 1 + seed % 5
    tensor = torch.randint(-1000, 1000, (chunk * world,), generator=generator(seed, rank))
    with switched_off(COLLECTIVES, P2P_ONLY), recording_p2p() as log:
        got = fn(tensor.clone())
    total = tensor.clone()
    dist.all_reduce(total)
    return got, total.chunk(world)[rank].clone(), log.bytes_sent, tensor.numel() * 8


def check_reduce_scatter(fn) -> str:
    seed = new_seed()
    for n in WORLD_SIZES:
        values = run_ranks(_reduce_scatter_trial, n, (fn, seed), where=on(n, seed),
                           hang_hint=DEADLOCK_HINT)
        for rank, (got, expected, sent, nbytes) in enumerate(values):
            problem = tensor_problem(got, expected)
            if problem:
                raise ExerciseFailed(f"{on(n, seed)}, rank {rank} should return chunk {rank} "
                                     f"summed over all ranks: {problem}")
            ring = nbytes * (n - 1) // n
            if sent > ring:
                raise ExerciseFailed(
                    f"{on(n, seed)}, rank {rank} sent {sent} bytes for a {nbytes}-byte "
                    f"tensor; the ring sends (N - 1) / N of it, {ring} bytes. Send one chunk "
                    "per step (a partial sum), never the whole tensor.")
    return f"right sums, and no more bytes than the ring, on 1-4 ranks (seed {seed})"


# -- 04.tree_broadcast ----------------------------------------------------------------------
def tree_broadcast(tensor: torch.Tensor, src: int) -> torch.Tensor:
    """Reference: a binomial tree. Number the ranks from ``src`` (relative rank); in round
    k (mask = 2**k) every rank that has the data (relative rank < mask) sends it to
    relative rank + mask. The number of ranks with the data doubles every round."""
    rank, world = dist.get_rank(), dist.get_world_size()
    relative = (rank - src) % world
    data = tensor.clone()
    mask = 1
    while mask < world:
        if relative < mask and relative + mask < world:
            dist.send(data, (relative + mask + src) % world)
        elif mask <= relative < 2 * mask:
            dist.recv(data, (relative - mask + src) % world)
        mask *= 2
    return data


def _broadcast_trial(fn, seed: int, src: int):
    rank = dist.get_rank()
    mine = random_tensor(seed, rank) if rank == src else torch.zeros_like(
        random_tensor(seed, rank))
    with switched_off(COLLECTIVES, P2P_ONLY), recording_p2p() as log:
        got = fn(mine.clone(), src)
    expected = mine.clone()
    dist.broadcast(expected, src)
    return got, expected, log.messages


def check_tree_broadcast(fn) -> str:
    seed = new_seed()
    for n in WORLD_SIZES:
        src = 1 + seed % (n - 1) if n > 1 else 0  # not 0: a tree rooted at 0 fails
        values = run_ranks(_broadcast_trial, n, (fn, seed, src), where=on(n, seed),
                           hang_hint="Does every recv have a matching send (same pair of "
                           "ranks, same order)?")
        for rank, (got, expected, _) in enumerate(values):
            problem = tensor_problem(got, expected)
            if problem:
                raise ExerciseFailed(f"{on(n, seed)}, src={src}: rank {rank} should return "
                                     f"rank {src}'s tensor: {problem}")
        _check_rounds(n, seed, src, [messages for _, _, messages in values])
    return f"src's tensor everywhere, in ceil(log2 N) rounds, on 1-4 ranks (seed {seed})"


def _check_rounds(n: int, seed: int, src: int, logs: list) -> None:
    try:
        taken = rounds(logs)
    except ValueError as err:
        raise ExerciseFailed(f"{on(n, seed)}: {err}") from None
    allowed = math.ceil(math.log2(n)) if n > 1 else 0
    if taken > allowed:
        sends = [sum(m.kind == "send" for m in log) for log in logs]
        raise ExerciseFailed(
            f"{on(n, seed)}, src={src}: your broadcast took {taken} rounds (sends per rank: "
            f"{sends}); a tree takes ceil(log2 {n}) = {allowed}. In a round each rank sends "
            "one message: let every rank that already has the data send it on, so the "
            "number of ranks with it doubles each round.")


EXERCISES = (
    Exercise(
        name="04.reduce_scatter",
        notebook="04_allreduce_from_scratch",
        summary="my_reduce_scatter(tensor): chunk r summed over the ranks, with the ring's bytes",
        hint="the ring's first phase: N - 1 steps; send chunk (rank - step - 1) % N to the "
             "right, add what comes from the left into chunk (rank - step - 2) % N.",
        solution=ring_reduce_scatter,
        checker=check_reduce_scatter,
    ),
    Exercise(
        name="04.tree_broadcast",
        notebook="04_allreduce_from_scratch",
        summary="my_broadcast(tensor, src): src's tensor on every rank in ceil(log2 N) rounds",
        hint="number the ranks from src: relative = (rank - src) % N. For mask = 1, 2, 4, ...: "
             "relative < mask sends to relative + mask; mask <= relative < 2 * mask receives.",
        solution=tree_broadcast,
        checker=check_tree_broadcast,
    ),
)
