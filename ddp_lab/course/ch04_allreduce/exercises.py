"""Notebook 04's exercises: reduce-scatter and a tree broadcast from send/recv, with the
cost counted.

While the learner's function runs, every collective is switched off and every
point-to-point message is logged (``bytes_sent``), both at the dispatcher, so an imported
name, ``distributed_c10d.X``, a process-group method or a functional collective is refused
or counted like ``dist.X``. The reduce-scatter must send no more than the ring's first
phase, (N - 1) / N of the tensor per rank, counted in the input's dtype (a downcast halves
no cost: the values use the whole int64 range, so a narrower dtype also loses them); the
broadcast must finish in ceil(log2 N) rounds, a round being one message per rank. The
inputs are random (a fresh seed per check) and the answers are compared with torch's
all_reduce/broadcast.
"""

from __future__ import annotations

import contextlib
import math

import torch
import torch.distributed as dist

from ddp_lab.course.collective_trace import COLLECTIVE_FAMILIES
from ddp_lab.exercises.builtins_off import refusing, replaced
from ddp_lab.exercises.bytes_sent import recording_p2p, rounds
from ddp_lab.exercises.driver import (WORLD_SIZES, each_world, generator, new_seed, random_tensor,
                                      tensor_problem)
from ddp_lab.exercises.driver import where as on
from ddp_lab.exercises.registry import Exercise, ExerciseFailed
from ddp_lab.scratch.ring import ring_reduce_scatter

P2P_ONLY = "build it from send/recv (isend/irecv) only"
# The key-value store's data methods: a tensor passed through the store would cost no
# counted byte, so they are off too (the group's rendezvous is long done by then).
STORE_METHODS = ("set", "get", "add", "append", "compare_set", "multi_get", "multi_set")
DEADLOCK_HINT = ("A blocking send on every rank at once can wait for a recv that no rank has "
                 "posted yet, until the process group's timeout (this check stops it sooner): "
                 "post isend and irecv together, then wait on both.")


@contextlib.contextmanager
def point_to_point_only(journal: str):
    """Collectives refused, every send and recv recorded (and journaled), the store off."""
    with contextlib.ExitStack() as stack:
        for name in STORE_METHODS:
            if hasattr(dist.Store, name):
                stack.enter_context(replaced(dist.Store, name, refusing(
                    f"Store.{name}", f"the store is for the rendezvous, not for data: "
                    f"{P2P_ONLY}")))
        yield stack.enter_context(recording_p2p(COLLECTIVE_FAMILIES, P2P_ONLY, journal))


# -- 04.reduce_scatter ----------------------------------------------------------------------
# Values over the whole int64 range (their sums too, on 4 ranks): a downcast loses them.
BIG = 2 ** 60


def _reduce_scatter_trial(fn, seed: int, journal: str):
    rank, world = dist.get_rank(), dist.get_world_size()
    chunk = 1 + seed % 5
    tensor = torch.randint(-BIG, BIG, (chunk * world,), generator=generator(seed, rank))
    with point_to_point_only(journal) as log:
        got = fn(tensor.clone())
    total = tensor.clone()
    dist.all_reduce(total)
    return got, total.chunk(world)[rank].clone(), log.messages, tensor.chunk(world)[rank].clone()


def check_reduce_scatter(fn) -> str:
    seed = new_seed()

    def judge(value: tuple, rank: int, n: int) -> str | None:
        got, expected, messages, mine = value
        problem = tensor_problem(got, expected, mine=mine)  # its own chunk, not summed?
        if problem:
            return (f" should return chunk {rank} summed over all ranks: {problem}"
                    f"{_narrowed(messages, expected.dtype)}")
        _check_bytes(f"{on(n, seed)}, rank {rank}", messages, expected, n)
        return None

    each_world(_reduce_scatter_trial, (fn, seed), judge, seed, journaled=True,
               hang_hint=DEADLOCK_HINT)
    return f"right sums, and no more bytes than the ring, on 1-4 ranks (seed {seed})"


def _check_bytes(where: str, messages: list, chunk: torch.Tensor, n: int) -> None:
    """At most (N - 1) chunks sent, counted in the input's dtype (int64): what the ring's
    first phase sends."""
    itemsize = chunk.element_size()
    sent = sum(m.numel for m in messages if m.kind == "send") * itemsize
    ring = (n - 1) * chunk.numel() * itemsize
    if sent > ring:
        raise ExerciseFailed(
            f"{where} sent {sent} bytes (counted as {chunk.dtype}, the input's dtype) for a "
            f"{n * chunk.numel() * itemsize}-byte tensor; the ring sends (N - 1) / N of it, "
            f"{ring} bytes. Send one chunk per step (a partial sum), never the whole "
            f"tensor.{_narrowed(messages, chunk.dtype)}")


def _narrowed(messages: list, dtype: torch.dtype) -> str:
    """A word on sends in another dtype than the input's, if there were any."""
    other = sorted({str(m.dtype) for m in messages if m.kind == "send" and m.dtype != dtype})
    if not other:
        return ""
    return (f" (You sent {', '.join(other)} for a {dtype} tensor: a narrower dtype loses "
            "these values, which use the whole int64 range, and bytes are counted in the "
            "input's dtype anyway.)")


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


def _broadcast_trial(fn, seed: int, src: int, journal: str):
    rank = dist.get_rank()
    mine = random_tensor(seed, rank) if rank == src else torch.zeros_like(
        random_tensor(seed, rank))
    with point_to_point_only(journal) as log:
        got = fn(mine.clone(), src)
    expected = mine.clone()
    dist.broadcast(expected, src)
    return got, expected, log.messages, mine


def check_tree_broadcast(fn) -> str:
    seed = new_seed()
    # src is not 0: a tree rooted at 0 fails
    src = {n: 1 + seed % (n - 1) if n > 1 else 0 for n in WORLD_SIZES}

    def judge_world(values: list, n: int) -> str | None:
        for rank, (got, expected, _, mine) in enumerate(values):
            problem = tensor_problem(got, expected, mine=mine)
            if problem:
                return (f", src={src[n]}: rank {rank} should return rank {src[n]}'s tensor: "
                        f"{problem}")
        _check_rounds(n, seed, src[n], [messages for _, _, messages, _ in values])
        return None

    each_world(_broadcast_trial, lambda n: (fn, seed, src[n]), seed=seed,
               judge_world=judge_world, journaled=True,
               hang_hint="Does every recv have a matching send (same pair of ranks, same "
                         "order)?")
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
        hint="it is the first phase of the ring all-reduce from this notebook: N - 1 steps, "
             "each rank sending one chunk (a partial sum) to its right neighbour while it "
             "receives one from its left and adds it in. Shift which chunk goes first so "
             "that rank r ends up holding chunk r; post the send and the recv together "
             "(isend/irecv) so that no two ranks wait on each other.",
        recipe="rank, N = dist.get_rank(), dist.get_world_size(); chunks = [c.clone() for c "
               "in tensor.chunk(N)]. For step in range(N - 1): send chunks[(rank - step - 1) "
               "% N] to (rank + 1) % N and receive into a fresh tensor shaped like chunks["
               "(rank - step - 2) % N] from (rank - 1) % N, both with isend/irecv, wait on "
               "both, then add the received tensor into chunks[(rank - step - 2) % N]. "
               "Return chunks[rank]. Keep the input's dtype: bytes are counted in it.",
        solution=ring_reduce_scatter,
        checker=check_reduce_scatter,
    ),
    Exercise(
        name="04.tree_broadcast",
        notebook="04_allreduce_from_scratch",
        summary="my_broadcast(tensor, src): src's tensor on every rank in ceil(log2 N) rounds",
        hint="a binomial tree: in each round, every rank that already holds the data sends "
             "it to one rank that does not, so the number of holders doubles. It is easiest "
             "with the ranks renumbered so that src is 0.",
        recipe="relative = (rank - src) % N; data = tensor.clone(); mask = 1. While mask < "
               "N: if relative < mask and relative + mask < N, dist.send(data, (relative + "
               "mask + src) % N); elif mask <= relative < 2 * mask, dist.recv(data, "
               "(relative - mask + src) % N); then mask *= 2. Return data.",
        solution=tree_broadcast,
        checker=check_tree_broadcast,
    ),
)
