"""Notebook 04's exercises: reduce-scatter and a tree broadcast from send/recv, with the
cost counted.

The checker's own process makes every rank's input from a fresh seed and hands each rank
only its own (``sealed.deal``); the expected values (a sum over the ranks' inputs, src's
tensor) and the comparison stay in the checker's process, so nothing a rank can reach holds
them. While the learner's function runs, every collective is switched off and every
point-to-point message is logged (``bytes_sent``), both at the dispatcher, so an imported
name, ``distributed_c10d.X``, a process-group method or a functional collective is refused
or counted like ``dist.X``. The reduce-scatter must send exactly the ring's first phase,
(N - 1) / N of the tensor per rank, counted in the input's dtype: more is the wrong
algorithm, fewer cannot carry values that use the whole int64 range (a downcast loses them
too). The broadcast must finish in ceil(log2 N) rounds, a round being one message per rank,
with every rank but src receiving the tensor exactly once.
"""

from __future__ import annotations

import math

import torch
import torch.distributed as dist

from ddp_lab.course.collective_trace import COLLECTIVE_FAMILIES
from ddp_lab.exercises.bytes_sent import recording_p2p, rounds
from ddp_lab.exercises.driver import (WORLD_SIZES, each_world, generator, new_seed, random_tensor,
                                      tensor_problem)
from ddp_lab.exercises.driver import where as on
from ddp_lab.exercises.registry import Exercise, ExerciseFailed
from ddp_lab.exercises.sealed import deal
from ddp_lab.scratch.ring import ring_reduce_scatter

P2P_ONLY = "build it from send/recv (isend/irecv) only"
DEADLOCK_HINT = ("A blocking send on every rank at once can wait for a recv that no rank has "
                 "posted yet, until the process group's timeout (this check stops it sooner): "
                 "post isend and irecv together, then wait on both.")


def point_to_point_only(journal: str):
    """Collectives refused, every send and recv recorded (and journaled). The store, files
    and threads, which would move data uncounted, are the seal's to close."""
    return recording_p2p(COLLECTIVE_FAMILIES, P2P_ONLY, journal)


# -- 04.reduce_scatter ----------------------------------------------------------------------
# Values over the whole int64 range (their sums too, on 4 ranks): a downcast loses them.
BIG = 2 ** 60


def reduce_scatter_inputs(seed: int, world: int) -> list[torch.Tensor]:
    """Every rank's input, made in the checker's process: N chunks of 1-5 elements."""
    chunk = 1 + seed % 5
    return [torch.randint(-BIG, BIG, (chunk * world,), generator=generator(seed, rank))
            for rank in range(world)]


def _reduce_scatter_trial(fn, dealt, journal: str):
    """On a rank: its own input only, the learner's result and every send/recv it made."""
    tensor = dealt.take()
    with point_to_point_only(journal) as log:
        got = fn(tensor)
    return got, log.messages


def check_reduce_scatter(fn) -> str:
    seed = new_seed()
    inputs = {n: reduce_scatter_inputs(seed, n) for n in WORLD_SIZES}

    def judge(value: tuple, rank: int, n: int) -> str | None:
        got, messages = value
        expected = sum(inputs[n]).chunk(n)[rank]
        mine = inputs[n][rank].chunk(n)[rank]
        problem = tensor_problem(got, expected, mine=mine)  # its own chunk, not summed?
        if problem:
            return (f" should return chunk {rank} summed over all ranks: {problem}"
                    f"{_narrowed(messages, expected.dtype)}")
        _check_bytes(f"{on(n, seed)}, rank {rank}", messages, expected, n)
        return None

    each_world(_reduce_scatter_trial, lambda n: (fn, deal(inputs[n])), judge, seed,
               journaled=True, hang_hint=DEADLOCK_HINT)
    return f"right sums, with exactly the ring's bytes, on 1-4 ranks (seed {seed})"


def _check_bytes(where: str, messages: list, chunk: torch.Tensor, n: int) -> None:
    """Exactly (N - 1) chunks sent, counted in the input's dtype (int64): what the ring's
    first phase sends. More is the wrong algorithm; fewer cannot carry the data (each of
    the N - 1 chunks that other ranks own holds values only this rank has, and they use all
    their bits), so the sums came some other way than send/recv."""
    itemsize = chunk.element_size()
    sent = sum(m.numel for m in messages if m.kind == "send") * itemsize
    ring = (n - 1) * chunk.numel() * itemsize
    if sent > ring:
        raise ExerciseFailed(
            f"{where} sent {sent} bytes (counted as {chunk.dtype}, the input's dtype) for a "
            f"{n * chunk.numel() * itemsize}-byte tensor; the ring sends (N - 1) / N of it, "
            f"{ring} bytes. Send one chunk per step (a partial sum), never the whole "
            f"tensor.{_narrowed(messages, chunk.dtype)}")
    if sent < ring:
        raise ExerciseFailed(
            f"{where} sent {sent} bytes (counted as {chunk.dtype}) with send/isend, fewer than "
            "any reduce-scatter needs: every chunk that another rank owns holds values only "
            f"this rank has, so at least N - 1 = {n - 1} chunks, {ring} bytes, must leave it. "
            "Move the data with send/recv (isend/irecv), one chunk per step.")


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


def broadcast_inputs(seed: int, world: int, src: int) -> list[torch.Tensor]:
    """Every rank's input, made in the checker's process: src's random tensor, zeros of its
    shape and dtype elsewhere."""
    data = random_tensor(seed, src)
    return [data.clone() if rank == src else torch.zeros_like(data) for rank in range(world)]


def _broadcast_trial(fn, dealt, src: int, journal: str):
    """On a rank: its own input only, the learner's result and every send/recv it made."""
    tensor = dealt.take()
    with point_to_point_only(journal) as log:
        got = fn(tensor, src)
    return got, log.messages


def check_tree_broadcast(fn) -> str:
    seed = new_seed()
    # src is not 0: a tree rooted at 0 fails
    src = {n: 1 + seed % (n - 1) if n > 1 else 0 for n in WORLD_SIZES}
    inputs = {n: broadcast_inputs(seed, n, src[n]) for n in WORLD_SIZES}

    def judge_world(values: list, n: int) -> str | None:
        expected = inputs[n][src[n]]
        for rank, (got, _) in enumerate(values):
            problem = tensor_problem(got, expected, mine=inputs[n][rank])
            if problem:
                return (f", src={src[n]}: rank {rank} should return rank {src[n]}'s tensor: "
                        f"{problem}")
        logs = [messages for _, messages in values]
        _check_rounds(n, seed, src[n], logs)
        _check_broadcast_bytes(f"{on(n, seed)}, src={src[n]}", logs, expected, src[n])
        return None

    each_world(_broadcast_trial, lambda n: (fn, deal(inputs[n]), src[n]), seed=seed,
               judge_world=judge_world, journaled=True,
               hang_hint="Does every recv have a matching send (same pair of ranks, same "
                         "order)?")
    return (f"src's tensor everywhere, in ceil(log2 N) rounds, each rank receiving it once, "
            f"on 1-4 ranks (seed {seed})")


def _check_broadcast_bytes(where: str, logs: list, data: torch.Tensor, src: int) -> None:
    """Each rank but src receives the tensor once, with recv: fewer bytes cannot carry it
    (its values are random), more is a copy sent to a rank that had it already."""
    size = data.numel() * data.element_size()
    for rank, log in enumerate(logs):
        received = sum(m.nbytes for m in log if m.kind == "recv")
        if rank != src and received < size:
            raise ExerciseFailed(
                f"{where}: rank {rank} received {received} bytes with recv/irecv, and the "
                f"tensor is {size} bytes: every rank but src must receive all of it, through "
                "send/recv.")
    sent = sum(m.nbytes for log in logs for m in log if m.kind == "send")
    if sent > (len(logs) - 1) * size:
        raise ExerciseFailed(
            f"{where}: your ranks sent {sent} bytes in all; a broadcast of a {size}-byte "
            f"tensor needs each of the {len(logs) - 1} other ranks to receive it once, "
            f"{(len(logs) - 1) * size} bytes. Send only to ranks that do not have the data "
            "yet.")


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
