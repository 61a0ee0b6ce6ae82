"""Notebook 02's exercises: data moved with point-to-point calls only.

Every collective is switched off at the dispatcher while the learner's function runs (in
every form: imported names, process-group methods, functional collectives); each send and
recv is journaled before it runs (``bytes_sent.recording_p2p``), so a pair whose buffers
differ in size or dtype is named as such (``naming_mismatches``), and so are a send to itself,
a peer that does not exist and, after a hang, unmatched sends (:mod:`.peers`), even when gloo
aborts the process. The tensors are random: a
shape from the check's seed, int64 on some world sizes and float32 on the others (every
check has both, so a buffer made with the default dtype fails every time), with values an
int16 or a float16 cannot carry. The checker makes every rank's tensor and hands each rank
only its own (:func:`~ddp_lab.exercises.sealed.deal`); the answers are compared in the
checker's process with the tensors it made. The bytes each rank sends and receives are
counted, floor and ceiling: an all-gather sends each rank's tensor at least once and at most
N - 1 times and brings each rank the N - 1 others' tensors; a shift sends and receives one
tensor (none when k is a multiple of N).
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from ddp_lab.course.ch02_point_to_point.peers import peer_problem
from ddp_lab.exercises.bytes_sent import recording_p2p
from ddp_lab.exercises.builtins_off import COLLECTIVES, families
from ddp_lab.exercises.driver import (WORLD_SIZES, describe, each_world, full_bits_tensor,
                                      generator, new_seed, tensor_problem)
from ddp_lab.exercises.registry import Exercise
from ddp_lab.exercises.sealed import deal

P2P_ONLY = "use only send/recv, isend/irecv or batch_isend_irecv"
DEADLOCK_HINT = ("If every rank first does a blocking send, they all wait for a recv nobody "
                 "posted (section 4): post isend and irecv together, then wait on both.")


def rank_tensors(seed: int, n: int) -> list[torch.Tensor]:
    """Every rank's tensor for one world size, made in the checker's process."""
    return [full_bits_tensor(seed, n, rank) for rank in range(n)]


def _run_p2p(fn, journal: str, *args):
    """fn(*args) with the collectives off, every send and recv journaled and counted:
    (what it returned, bytes it sent, bytes it received)."""
    with recording_p2p(families(COLLECTIVES), P2P_ONLY, journal) as log:
        got = fn(*args)
    received = sum(m.nbytes for m in log.messages if m.kind == "recv")
    return got, log.bytes_sent, received


def _journaled_worlds(trial, args, seed: int, judge=None, judge_world=None) -> None:
    """each_world with every send and recv journaled: a crash or a hang says what the
    journals show (a send to itself, a peer that does not exist, unmatched sends), a wrong
    answer names mismatched pairs first."""
    each_world(trial, args, judge, seed, judge_world=judge_world, journaled=True,
               hang_hint=DEADLOCK_HINT,
               explain=lambda err, n, journal: peer_problem(journal, n, err))


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


def _all_gather_trial(fn, dealt, journal: str):
    return _run_p2p(fn, journal, dealt.take())


def check_all_gather(fn) -> str:
    seed = new_seed()
    tensors = {n: rank_tensors(seed, n) for n in WORLD_SIZES}
    _journaled_worlds(_all_gather_trial, lambda n: (fn, deal(tensors[n])), seed,
                      judge=lambda value, rank, n: (
                          _list_problem(value[0], tensors[n], rank)
                          or _gather_cost(*value[1:], tensors[n][0], n)))
    return (f"every rank's tensor on every rank, in rank order, each rank sending its own at "
            f"least once and N - 1 tensors' worth at most, on 1-4 ranks, int64 and float32 "
            f"(seed {seed})")


def _list_problem(got, expected: list, rank: int) -> str | None:
    if not isinstance(got, (list, tuple)) or len(got) != len(expected):
        return (f"expected a list of {len(expected)} tensors, item j being rank j's tensor; "
                f"got {describe(got)}")
    for j, (item, theirs) in enumerate(zip(got, expected)):
        problem = tensor_problem(item, theirs, mine=expected[rank] if j != rank else None)
        if problem:
            return f"item [{j}] should be rank {j}'s tensor: {problem}"
    return None


def _gather_cost(sent: int, received: int, tensor: torch.Tensor, n: int) -> str | None:
    one = tensor.numel() * tensor.element_size()
    if n > 1 and sent < one:
        return (f"it sent {sent} bytes, and its tensor is {one} bytes: every other rank needs "
                "that tensor, whose values no other rank holds, so it must leave this rank "
                "at least once, whole.")
    if received < (n - 1) * one:
        return (f"it received {received} bytes, and it lacks the other N - 1 = {n - 1} "
                f"ranks' tensors, {(n - 1) * one} bytes: they can only reach it through its "
                "recvs.")
    if sent <= (n - 1) * one:
        return None
    return (f"it sent {sent} bytes, {sent / one:g} times its tensor of {one} bytes: an "
            f"all-gather needs each rank to send at most N - 1 = {n - 1} tensors' worth (a "
            "ring passes each tensor on once; a direct exchange sends your own to each other "
            "rank once). Routing everything through one rank makes it send N (N - 1).")


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


def shifts(seed: int, n: int) -> list[int]:
    """k below n, the same k plus a multiple of n (modulo matters), and a multiple of n. On
    4 ranks k is 2: the ranks pair up (0 and 2, 1 and 3), so an order of blocking calls
    that only breaks a ring of all the ranks (even ranks send first) still deadlocks."""
    draw = torch.randint(1, 1000, (3,), generator=generator(seed, n, 11)).tolist()
    small = 2 if n == 4 else 1 + draw[0] % max(1, n - 1)
    return [small, small + n * (1 + draw[1] % 2), n * (draw[2] % 3)]


def _shift_trial(fn, dealt, ks: list, journal: str):
    mine = dealt.take()
    return [_run_p2p(fn, journal, mine.clone(), k) for k in ks]


def check_shift(fn) -> str:
    seed = new_seed()
    tensors = {n: rank_tensors(seed, n) for n in WORLD_SIZES}
    _journaled_worlds(_shift_trial, lambda n: (fn, deal(tensors[n]), shifts(seed, n)), seed,
                      judge_world=lambda values, n: _shifts_problem(values, shifts(seed, n),
                                                                    tensors[n]))
    return (f"every rank got the tensor from k places to its left (k below, above and a "
            f"multiple of N), sending and receiving one tensor (none for a multiple of N), "
            f"on 1-4 ranks (seed {seed})")


def _shifts_problem(values: list, ks: list, everybody: list) -> str | None:
    for i, k in enumerate(ks):
        for rank, (got, sent, received) in enumerate(v[i] for v in values):
            problem = (_shift_problem(got, everybody, rank, k)
                       or _shift_cost(sent, received, everybody[0], rank, k % len(everybody)))
            if problem:
                return f", k={k}: {problem}"
    return None


def _shift_problem(got, everybody: list, rank: int, k: int) -> str | None:
    n = len(everybody)
    source = (rank - k) % n
    problem = tensor_problem(got, everybody[source],
                             mine=everybody[rank] if source != rank else None)
    if problem:
        return (f"rank {rank} should return rank {source}'s tensor (rank - k, modulo {n}): "
                f"{problem}")
    return None


def _shift_cost(sent: int, received: int, tensor: torch.Tensor, rank: int,
                moved: int) -> str | None:
    """``moved``: k modulo the world size (0: the tensor stays home)."""
    one = tensor.numel() * tensor.element_size()
    if sent > one:
        return (f"rank {rank} sent {sent} bytes, {sent / one:g} times its tensor: a shift "
                "moves each tensor once, one send per rank (and none when k is a multiple "
                "of the world size).")
    if moved and (sent < one or received < one):
        return (f"rank {rank} sent {sent} and received {received} bytes, and a tensor is "
                f"{one} bytes: unless k is a multiple of the world size, each rank's tensor "
                "must leave it whole, and the one it returns arrive whole, through a send and "
                "a recv.")
    return None


EXERCISES = (
    Exercise(
        name="02.all_gather",
        notebook="02_point_to_point",
        summary="my_all_gather(tensor): every rank's tensor, in rank order, from send/recv",
        hint="every rank must end up with every tensor, and each tensor need travel over "
             "each link once: pass tensors around a ring, or send yours straight to each "
             "other rank. Receive into buffers like the tensor sent, and remember section 4 "
             "(who waits for whom).",
        recipe="gathered = [torch.empty_like(tensor) for each rank], gathered[rank] = a copy "
               "of yours. Ring: for step in range(world_size - 1): isend gathered[(rank - "
               "step) % world_size] to (rank + 1) % world_size and irecv into gathered[(rank "
               "- step - 1) % world_size] from (rank - 1) % world_size, then wait() on both. "
               "Return gathered.",
        solution=ring_all_gather,
        checker=check_all_gather,
    ),
    Exercise(
        name="02.shift",
        notebook="02_point_to_point",
        summary="my_shift(tensor, k): the tensor of the rank k places to the left",
        hint="your tensor goes k places to the right, and the one you keep comes from k "
             "places to the left (ranks wrap around: modulo the world size). Post both "
             "before waiting on either; a k that brings a tensor back home moves nothing.",
        recipe="if k % world_size == 0: return tensor.clone(). Else received = "
               "torch.empty_like(tensor); post dist.isend(tensor, (rank + k) % world_size) "
               "and dist.irecv(received, (rank - k) % world_size), wait() on both, return "
               "received.",
        solution=shift,
        checker=check_shift,
    ),
)
