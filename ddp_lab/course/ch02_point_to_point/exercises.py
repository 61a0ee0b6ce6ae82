"""Notebook 02's exercises: data moved with point-to-point calls only.

Every collective is switched off while the learner's function runs; the tensors are random
(shape, dtype and values from the check's seed), and the answer is compared with torch's own
``dist.all_gather`` on the same tensors, run right after.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from ddp_lab.exercises.builtins_off import COLLECTIVES, switched_off
from ddp_lab.exercises.driver import (WORLD_SIZES, describe, new_seed, random_tensor, run_ranks,
                                     tensor_problem)
from ddp_lab.exercises.driver import where as on
from ddp_lab.exercises.registry import Exercise, ExerciseFailed

P2P_ONLY = "use only send/recv, isend/irecv or batch_isend_irecv"
DEADLOCK_HINT = ("If every rank first does a blocking send, they all wait for a recv nobody "
                 "posted (section 4): post isend and irecv together, then wait on both.")


def _gathered_by_torch(mine: torch.Tensor) -> list[torch.Tensor]:
    expected = [torch.empty_like(mine) for _ in range(dist.get_world_size())]
    dist.all_gather(expected, mine)
    return expected


# -- 02.all_gather --------------------------------------------------------------------------
def ring_all_gather(tensor: torch.Tensor) -> list[torch.Tensor]:
    """Reference: a ring. At each of the N - 1 steps, pass to the right what arrived in the
    step before (your own tensor first) and receive the next one from the left."""
    rank, world = dist.get_rank(), dist.get_world_size()
    right, left = (rank + 1) % world, (rank - 1) % world
    gathered = [torch.empty_like(tensor) for _ in range(world)]
    gathered[rank] = tensor.clone()
    for step in range(world - 1):
        outgoing = gathered[(rank - step) % world]
        incoming = gathered[(rank - step - 1) % world]
        for request in (dist.isend(outgoing, right), dist.irecv(incoming, left)):
            request.wait()
    return gathered


def _all_gather_trial(fn, seed: int):
    mine = random_tensor(seed, dist.get_rank())
    with switched_off(COLLECTIVES, P2P_ONLY):
        got = fn(mine.clone())
    return got, _gathered_by_torch(mine)


def check_all_gather(fn) -> str:
    seed = new_seed()
    for n in WORLD_SIZES:
        values = run_ranks(_all_gather_trial, n, (fn, seed), where=on(n, seed),
                           hang_hint=DEADLOCK_HINT)
        for rank, (got, expected) in enumerate(values):
            problem = _list_problem(got, expected)
            if problem:
                raise ExerciseFailed(f"{on(n, seed)}, rank {rank}: {problem}")
    return f"the same lists as dist.all_gather on 1-4 ranks (seed {seed})"


def _list_problem(got, expected: list) -> str | None:
    if not isinstance(got, (list, tuple)) or len(got) != len(expected):
        return (f"expected a list of {len(expected)} tensors, item j being rank j's tensor; "
                f"got {describe(got)}")
    for j, (mine, theirs) in enumerate(zip(got, expected)):
        problem = tensor_problem(mine, theirs)
        if problem:
            return f"item [{j}] should be rank {j}'s tensor: {problem}"
    return None


# -- 02.shift ---------------------------------------------------------------------------------
def shift(tensor: torch.Tensor, k: int) -> torch.Tensor:
    """Reference: send to the rank k places to the right, receive from the one k places to
    the left, both posted before waiting (no deadlock, whatever the sizes)."""
    rank, world = dist.get_rank(), dist.get_world_size()
    if k % world == 0:
        return tensor.clone()
    received = torch.empty_like(tensor)
    for request in (dist.isend(tensor, (rank + k) % world),
                    dist.irecv(received, (rank - k) % world)):
        request.wait()
    return received


def _shift_trial(fn, seed: int, k: int):
    mine = random_tensor(seed, dist.get_rank())
    with switched_off(COLLECTIVES, P2P_ONLY):
        got = fn(mine.clone(), k)
    return got, _gathered_by_torch(mine)


def check_shift(fn) -> str:
    seed = new_seed()
    for n in WORLD_SIZES:
        k = 1 + seed % 3
        values = run_ranks(_shift_trial, n, (fn, seed, k), where=on(n, seed),
                           hang_hint=DEADLOCK_HINT)
        for rank, (got, everybody) in enumerate(values):
            source = (rank - k) % n
            problem = tensor_problem(got, everybody[source])
            if problem:
                raise ExerciseFailed(
                    f"{on(n, seed)}, k={k}: rank {rank} should return rank {source}'s tensor "
                    f"(rank - k, modulo {n}): {problem}")
    return f"every rank got the tensor from k places to its left on 1-4 ranks (seed {seed})"


EXERCISES = (
    Exercise(
        name="02.all_gather",
        notebook="02_point_to_point",
        summary="my_all_gather(tensor): every rank's tensor, in rank order, from send/recv",
        hint="a ring: N - 1 steps; each step isend to the right what you got in the step "
             "before (your own first), irecv from the left, wait on both.",
        solution=ring_all_gather,
        checker=check_all_gather,
    ),
    Exercise(
        name="02.shift",
        notebook="02_point_to_point",
        summary="my_shift(tensor, k): the tensor of the rank k places to the left",
        hint="isend to (rank + k) % world_size and irecv from (rank - k) % world_size, then "
             "wait on both; with k a multiple of world_size, return a copy of your own.",
        solution=shift,
        checker=check_shift,
    ),
)
