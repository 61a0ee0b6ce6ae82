"""Notebook 01's exercises: a barrier made of a store, and printing in rank order.

Both are about waiting for the others, so both are judged by when things happen against
late arrivals of random length, which no fixed wait can match. The barrier: in each round one
random rank arrives late by a random 0.2-1.5 s; every rank must leave after the last arrival
and soon after it (``SOON_S``). Printing: one random rank's ``print`` is slow by a random
0.2-1.5 s (its line takes that long to come out, as on a busy terminal); the lines must come
out in rank order, each from its own rank, and each rank must begin its line soon after the
line before it came out. One trial in each check is late by more than ``SOON_S`` and has
three or more ranks, so a sleep of any fixed length (``time.sleep``, an imported ``sleep``,
``threading.Event().wait``) leaves too early there or too late everywhere. Nothing is
patched but the collectives (switched off at the dispatcher in the barrier, where the store
is the exercise and its one open door) and the output streams (to see when each line comes
out). The lateness plan is the checker's: each rank is handed only its own delays
(:func:`~ddp_lab.exercises.sealed.deal`), its own line, and no seed.
"""

from __future__ import annotations

import contextlib
import secrets
import sys
import time

import torch
import torch.distributed as dist
from torch.distributed import PrefixStore, distributed_c10d

from ddp_lab.course.ch01_processes.processes import StampedStdout
from ddp_lab.exercises.builtins_off import COLLECTIVES, switched_off
from ddp_lab.exercises.driver import WORLD_SIZES, each_world, generator, new_seed
from ddp_lab.exercises.registry import Exercise
from ddp_lab.exercises.sealed import deal

# How soon after the awaited event a rank must go on: a wakeup takes milliseconds, and a
# machine with ten times more processes than cores still makes it in well under this.
SOON_S = 0.75
LATE_S = (0.2, 0.7)       # the usual lateness
# One trial per check is later than SOON_S: a fixed wait long enough for it keeps the late
# rank itself waiting longer than SOON_S after it arrived, so no fixed wait passes.
VERY_LATE_S = (1.0, 1.5)
STORE_ONLY = COLLECTIVES + ("barrier", "monitored_barrier", "send", "recv", "isend", "irecv")


def _store(prefix: str) -> PrefixStore:
    """Keys of this check's own in the launcher's store (torch's default-group store:
    ``distributed_c10d._get_default_store``, the one init_process_group used)."""
    return PrefixStore(prefix, distributed_c10d._get_default_store())


def lateness_plan(seed: int, trials: list) -> dict:
    """A random lateness (s) for each trial; one trial with 3 or more ranks gets a very
    late one. ``trials`` are (world_size, ...) tuples."""
    big = [t for t in trials if t[0] >= 3]
    chosen = big[int(torch.randint(0, len(big), (1,), generator=generator(seed, 3)))]
    plan = {}
    for i, trial in enumerate(trials):
        low, high = VERY_LATE_S if trial == chosen else LATE_S
        u = torch.rand((), generator=generator(seed, 5, i)).item()
        plan[trial] = round(low + (high - low) * u, 3)
    return plan


def _prefix() -> str:
    """Keys of one trial's own in the store, named by no seed."""
    return secrets.token_hex(8)


def _pick(seed: int, n: int, *salt: int) -> int:
    return int(torch.randint(0, n, (1,), generator=generator(seed, n, *salt)))


# -- 01.store_barrier ----------------------------------------------------------------------
def store_barrier(store, world_size: int, name: str) -> None:
    """Reference: count arrivals with ``add``; the last to arrive sets a "go" key that
    everybody waits for. ``name`` gives every barrier keys of its own (reusable)."""
    if store.add(f"{name}/arrived", 1) == world_size:
        store.set(f"{name}/go", "1")
    store.wait([f"{name}/go"])


def _barrier_trial(barrier, prefix: str, dealt) -> list:
    """Each round: line up (torch's barrier), this rank sleeps its delay (0 but on the late
    rank), everybody calls the learner's barrier; (arrived, left) per round, in wall-clock
    seconds."""
    world = dist.get_world_size()
    theirs = _store(f"ex01b/{prefix}/yours")
    seen = []
    for r, delay in enumerate(dealt.take()):
        dist.barrier()
        time.sleep(delay)
        arrived = time.time()
        with switched_off(STORE_ONLY, "build the barrier from the store alone"):
            barrier(theirs, world, f"barrier{r}")
        seen.append((arrived, time.time()))
    return seen


def check_store_barrier(fn, rounds: int = 2) -> str:
    seed = new_seed()
    plan = lateness_plan(seed, [(n, r) for n in WORLD_SIZES if n > 1 for r in range(rounds)])
    late = {n: [(_pick(seed, n, r), plan.get((n, r), 0.0)) for r in range(rounds)]
            for n in WORLD_SIZES}

    def judge_world(seen: list, n: int) -> str | None:
        for r, (late_rank, lateness) in enumerate(late[n]):
            problem = _barrier_problem([log[r] for log in seen], late_rank, lateness, r)
            if problem:
                return f", barrier {r}: {problem}"
        return None

    delays = {n: [[lateness if rank == late_rank else 0.0 for late_rank, lateness in late[n]]
                  for rank in range(n)] for n in WORLD_SIZES}
    each_world(_barrier_trial, lambda n: (fn, _prefix(), deal(delays[n])), seed=seed,
               judge_world=judge_world,
               hang_hint="A rank waited for a key nobody set: does the last rank to arrive "
                         "set the key the others wait for, and does each barrier use keys of "
                         "its own (name)?")
    return (f"every rank left after the last arrival, and within {SOON_S} s of it, {rounds} "
            f"barriers in a row with a random rank late by a random time, on 1-4 ranks "
            f"(seed {seed})")


def _barrier_problem(times: list, late: int, lateness: float, r: int) -> str | None:
    last = max(arrived for arrived, _ in times)
    early = [rank for rank, (_, left) in enumerate(times) if left < last]
    slow = {rank: left - last for rank, (_, left) in enumerate(times) if left - last > SOON_S}
    held = (f"rank {late} arrived {lateness:g} s after the others (on purpose, a random time)"
            if len(times) > 1 else "the one rank arrived")
    if early:
        at_once = all(times[k][1] - times[k][0] < 0.05 for k in early)
        again = (" They did not wait at all, and only from the second barrier on: does each "
                 "barrier use keys of its own (put name in them)?") if r and at_once else ""
        return (f"{held}, and rank(s) {early} left before it arrived. A barrier must hold "
                "every rank until the last one is in, however late that is: a fixed wait "
                "cannot know." + again)
    if slow:
        waits = ", ".join(f"rank {k} {s:.2f} s" for k, s in slow.items())
        return (f"{held}; every rank waited for it, but some left long after it arrived "
                f"({waits}; a barrier lets everybody go within {SOON_S} s). Waiting a fixed "
                "time is not synchronizing: block on something the last arrival does.")
    return None


# -- 01.rank_ordered_print -------------------------------------------------------------------
def print_in_rank_order(line: str) -> None:
    """Reference: take turns. In turn r, rank r prints and everybody meets at a barrier,
    so rank r+1 prints only after rank r has."""
    for turn in range(dist.get_world_size()):
        if turn == dist.get_rank():
            print(line, flush=True)
        dist.barrier()


class SlowStampedStdout(StampedStdout):
    """An output stream whose every line takes ``delay`` seconds to come out. Notes, per
    line, when the rank began writing it and when it came out (wall-clock seconds, one clock
    for every rank of the machine: the order the lines came out in). It needs no store,
    which stays closed while the learner's function runs."""

    def __init__(self, target, delay: float):
        super().__init__(target)
        self.delay, self.began = delay, None

    def write(self, text: str) -> int:
        if self.began is None and text:
            self.began = time.time()
        *complete, self.partial = (self.partial + text).split("\n")
        for line in complete:
            time.sleep(self.delay)
            self.target.write(line + "\n")
            self.lines.append((self.began, time.time(), line))
            self.began = time.time() if self.partial else None
        return len(text)


def _print_trial(fn, dealt):
    """This rank's line printed by the learner's function through a stream that is slow by
    this rank's delay (0 but on the slow rank)."""
    line, delay = dealt.take()
    out, err = (SlowStampedStdout(s, delay) for s in (sys.stdout, sys.stderr))
    dist.barrier()
    started = time.time()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        fn(line)
    return started, out.lines + err.lines


def _lines(seed: int, n: int) -> list[str]:
    """Each rank's line: a number drawn from the check's seed, not that number itself."""
    said = int(torch.randint(100, 1000, (1,), generator=generator(seed, 13)))
    return [f"rank {r} says {said + r}" for r in range(n)]


def _lines_and_delays(seed: int, n: int, slow: int, lateness: float):
    """Each rank's line and its stream's delay, dealt: only the slow rank's is not 0."""
    lines = _lines(seed, n)
    return deal([(line, lateness if r == slow else 0.0) for r, line in enumerate(lines)])


def check_rank_ordered_print(fn) -> str:
    seed = new_seed()
    plan = lateness_plan(seed, [(n,) for n in WORLD_SIZES if n > 1])
    slow = {n: (_pick(seed, n - 1, 9), plan[(n,)]) if n > 1 else (-1, 0.0)
            for n in WORLD_SIZES}
    each_world(_print_trial, lambda n: (fn, _lines_and_delays(seed, n, *slow[n])), seed=seed,
               judge_world=lambda results, n: _print_problem(results, _lines(seed, n),
                                                             *slow[n]),
               hang_hint="Does every rank make the same collective calls, the same number of "
                         "times?")
    return (f"the lines came out in rank order, each soon after the one before, with a random "
            f"rank's print slow by a random time, on 1-4 ranks (seed {seed})")


def _print_problem(results: list, expected: list, slow: int, lateness: float) -> str | None:
    lines = sorted((out, began, rank, text) for rank, (_, printed) in enumerate(results)
                   for began, out, text in printed if text in expected)
    texts = [text for *_, text in lines]
    held = (f" Rank {slow}'s print was slow on purpose (its line took {lateness:g} s to come "
            "out, a random time, as on a busy terminal)." if slow >= 0 else "")
    if texts != expected:
        return (f"the lines came out as {texts}, expected {expected}.{held} Each rank must "
                "print its line exactly once, and only once every lower rank's line is out: "
                "make each rank wait for the one before it; a fixed wait cannot know how long "
                "a print takes.")
    for _, _, rank, text in lines:
        if text != expected[rank]:
            return (f"rank {rank} printed {text!r}: every rank prints its own line (it "
                    "is handed to each rank), none prints the others'.")
    previous_out = float("-inf")
    for r, (out, began, _, _) in enumerate(lines):
        waited = began - max(results[r][0], previous_out)
        if waited > SOON_S:
            return (f"rank {r} began its line {waited:.2f} s after it could have (after "
                    f"rank {r - 1}'s line came out, or after it started).{held} The order was "
                    f"right, but a rank should go on within {SOON_S} s: waiting a fixed time "
                    "is not synchronizing; block on something the rank before you does.")
        previous_out = out
    return None


EXERCISES = (
    Exercise(
        name="01.store_barrier",
        notebook="01_processes_ranks_and_stores",
        summary="my_barrier(store, world_size, name): a reusable barrier from store calls",
        hint="the store can count (store.add returns the count after your increment) and can "
             "make a rank block until a key exists (store.wait). Who knows that everybody "
             "has arrived, and how can they tell the others? Keys that contain name keep one "
             "barrier apart from the next.",
        recipe="count = store.add(f'{name}/count', 1); the rank whose count == world_size is "
               "the last to arrive: it does store.set(f'{name}/go', '1'); then every rank "
               "(that one too) calls store.wait([f'{name}/go']) and returns.",
        solution=store_barrier,
        checker=check_store_barrier,
        open_doors=("store",),
    ),
    Exercise(
        name="01.rank_ordered_print",
        notebook="01_processes_ranks_and_stores",
        summary="print_in_rank_order(line): every rank prints its line, rank 0 first",
        hint="let the ranks take turns: rank r may print only once rank r-1's line is out, "
             "and nothing but waiting on the others can tell when that is (a fixed wait "
             "cannot). Every rank must make the same collective calls.",
        recipe="for turn in range(world_size): if turn == rank, print(line, flush=True); then, "
               "on every rank, dist.barrier() -- the barrier ends turn r only once rank r "
               "has printed.",
        solution=print_in_rank_order,
        checker=check_rank_ordered_print,
    ),
)
