"""Notebook 01's exercises: a barrier made of a store, and printing in rank order.

Both are about order, so both are checked without clocks. The barrier: one rank is held
back by a blocking wait on the store until every other rank is inside the barrier (and,
if the barrier leaks, until the first one has left), then sets an "arrived" counter; every
rank reads that counter as it leaves, and a barrier that lets a rank out before the late
one arrived is caught by the counter, not by timestamps. Printing: the ranks are made to
start in reverse order (rank k starts only once rank k+1 printed or entered a collective)
and each ``print`` takes a ticket from the store. In both, ``time.sleep`` is switched off:
waiting a while is not synchronizing.
"""

from __future__ import annotations

import builtins
import contextlib
from datetime import timedelta

import torch.distributed as dist
from torch.distributed import PrefixStore, distributed_c10d

from ddp_lab.exercises.builtins_off import COLLECTIVES, replaced, switched_off
from ddp_lab.exercises.driver import WORLD_SIZES, new_seed, run_ranks
from ddp_lab.exercises.driver import where as on
from ddp_lab.exercises.registry import Exercise, ExerciseFailed

NO_SLEEP = "sleeping a while does not wait for the others; block on something they do"
GRACE = timedelta(seconds=0.3)  # how long the late rank lets a leaky barrier leak


def _store(prefix: str) -> PrefixStore:
    """Keys of this check's own in the launcher's store (torch's default-group store:
    ``distributed_c10d._get_default_store``, the one init_process_group used)."""
    return PrefixStore(prefix, distributed_c10d._get_default_store())


# -- 01.store_barrier ----------------------------------------------------------------------
def store_barrier(store, world_size: int, name: str) -> None:
    """Reference: count arrivals with ``add``; the last to arrive sets a "go" key that
    everybody waits for. ``name`` gives every barrier keys of its own (reusable)."""
    if store.add(f"{name}/arrived", 1) == world_size:
        store.set(f"{name}/go", "1")
    store.wait([f"{name}/go"])


def _barrier_trial(barrier, seed: int, rounds: int) -> list[dict]:
    rank, world = dist.get_rank(), dist.get_world_size()
    store, theirs = _store(f"ex01b/{seed}/check"), _store(f"ex01b/{seed}/yours")
    seen = []
    for r in range(rounds):
        late = (seed + r) % world
        if rank == late:
            _hold_back(store, r, world)
            store.add(f"{r}/late_in", 1)
        else:
            if store.add(f"{r}/entered", 1) == world - 1:
                store.set(f"{r}/all_entered", "1")
        with _no_sleep(), switched_off(COLLECTIVES + ("barrier", "monitored_barrier"),
                                       "build the barrier from the store alone"):
            barrier(theirs, world, f"barrier{r}")
        seen.append({"late": late, "late_was_in": store.add(f"{r}/late_in", 0) == 1})
        store.set(f"{r}/someone_left", "1")
    return seen


def _hold_back(store, r: int, world: int) -> None:
    """The late rank waits until everybody else is inside the barrier, then a moment more
    unless somebody leaves (a wrong barrier) sooner."""
    if world == 1:
        return
    store.wait([f"{r}/all_entered"])
    try:
        store.wait([f"{r}/someone_left"], GRACE)
    except (RuntimeError, dist.DistError):  # nobody left: a store timeout, as it should be
        pass


@contextlib.contextmanager
def _no_sleep():
    import time
    with switched_off(("sleep",), NO_SLEEP, module="time"):
        yield time


def check_store_barrier(fn, rounds: int = 2) -> str:
    seed = new_seed()
    for n in WORLD_SIZES:
        seen = run_ranks(_barrier_trial, n, (fn, seed, rounds), where=on(n, seed),
                         hang_hint="A rank waited for a key nobody set: does the last rank "
                         "to arrive (add returned world_size) set the key the others wait "
                         "for, and does each barrier use keys of its own (name)?")
        for r in range(rounds):
            early = [rank for rank, log in enumerate(seen) if not log[r]["late_was_in"]]
            if early:
                raise ExerciseFailed(_leak_message(n, seed, r, early, seen[0][r]["late"]))
    return f"no rank ever left before the last one arrived: {rounds} barriers in a row " \
           f"on 1-4 ranks (seed {seed})"


def _leak_message(n: int, seed: int, r: int, early: list[int], late: int) -> str:
    again = (" It failed only from the second barrier on: does each barrier use keys of "
             "its own (put name in them)?") if r else ""
    return (f"{on(n, seed)}, barrier {r}: rank(s) {early} left before rank {late} (held "
            "back on purpose) had arrived. A barrier must hold every rank until the last "
            "one is in: count arrivals with store.add, and store.wait for a key that only "
            "the last arrival sets." + again)


# -- 01.rank_ordered_print -------------------------------------------------------------------
def print_in_rank_order(line: str) -> None:
    """Reference: take turns. In turn r, rank r prints and everybody meets at a barrier,
    so rank r+1 prints only after rank r has."""
    for turn in range(dist.get_world_size()):
        if turn == dist.get_rank():
            print(line, flush=True)
        dist.barrier()


SYNC_CALLS = ("barrier", "all_reduce", "broadcast", "all_gather", "all_gather_object",
              "broadcast_object_list", "gather_object", "send", "recv", "isend", "irecv")


def _print_trial(fn, seed: int) -> list:
    rank, world = dist.get_rank(), dist.get_world_size()
    store = _store(f"ex01p/{seed}")
    printed = []

    def busy() -> None:  # this rank printed or entered a collective: the next may start
        store.set(f"busy/{rank}", "1")

    def ticketed_print(*args, **kwargs):
        printed.append((store.add("tickets", 1), " ".join(map(str, args))))
        busy()
        return real_print(*args, **kwargs)

    real_print = builtins.print
    if rank < world - 1:
        store.wait([f"busy/{rank + 1}"])  # ranks start in reverse order
    with contextlib.ExitStack() as stack:
        stack.enter_context(_no_sleep())
        stack.enter_context(replaced(builtins, "print", ticketed_print))
        for name in SYNC_CALLS:
            stack.enter_context(replaced(dist, name, _announcing(getattr(dist, name), busy)))
        fn(f"rank {rank} says {seed % 1000 + rank}")
    return printed


def _announcing(original, announce):
    def call(*args, **kwargs):
        announce()
        return original(*args, **kwargs)
    return call


def check_rank_ordered_print(fn) -> str:
    seed = new_seed()
    for n in WORLD_SIZES:
        printed = run_ranks(_print_trial, n, (fn, seed), where=on(n, seed),
                            hang_hint="Does every rank make the same collective calls, "
                            "the same number of times?")
        expected = [f"rank {r} says {seed % 1000 + r}" for r in range(n)]
        lines = [line for _, line in sorted(t for per_rank in printed for t in per_rank)]
        if lines != expected:
            raise ExerciseFailed(
                f"{on(n, seed)}, with the ranks starting in reverse order (rank {n - 1} "
                f"first): the lines came out as {lines}, expected {expected}. Each rank "
                "must print its line exactly once, and only after every lower rank printed: "
                "take turns, with a barrier after each turn.")
    return f"the lines came out in rank order on 1-4 ranks, started in reverse (seed {seed})"


EXERCISES = (
    Exercise(
        name="01.store_barrier",
        notebook="01_processes_ranks_and_stores",
        summary="my_barrier(store, world_size, name): a reusable barrier from store calls",
        hint="store.add(f'{name}/count', 1) returns the count after your increment: the rank "
             "that sees world_size sets a key; everybody store.wait()s for that key.",
        solution=store_barrier,
        checker=check_store_barrier,
    ),
    Exercise(
        name="01.rank_ordered_print",
        notebook="01_processes_ranks_and_stores",
        summary="print_in_rank_order(line): every rank prints its line, rank 0 first",
        hint="loop over turn in range(world_size): the rank whose turn it is prints (flush), "
             "then every rank calls dist.barrier().",
        solution=print_in_rank_order,
        checker=check_rank_ordered_print,
    ),
)
