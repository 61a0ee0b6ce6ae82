"""Notebook 08b's exercise: from per-rank Flight-Recorder-like records, name the first
collective that some ranks never joined, and those ranks.

What ``torchfrtrace`` does for the notebook's dumps, reduced to its core: each rank's record
is a list of ``(seq, collective)`` entries, the collectives that rank issued, by sequence
number. The records are random per check: world sizes 1-8, a ring buffer that has dropped
each rank's oldest entries (so the lists start at different seqs and their lengths say
nothing), ranks that joined the stuck collective and went on with async ones, and on every
check full buffers of equal lengths with ranks behind, buffers that have all dropped the
stuck collective (its name is then unknown: ``None`` in its place), and ranks stuck at the
very first collective (their records are empty). A pure function: the checker draws every
record, one rank answers them all (``answers_in_a_rank``), the checker compares.
"""

from __future__ import annotations

import random

from ddp_lab.exercises.answers_in_a_rank import answers, other
from ddp_lab.exercises.driver import new_seed
from ddp_lab.exercises.registry import Exercise, ExerciseFailed

TRIALS = 200
NAMES = ("all_reduce", "broadcast", "all_gather", "reduce_scatter", "barrier")


def first_unjoined(records: dict[int, list[tuple[int, str]]]):
    """Reference: the lowest sequence number that some rank reached and some rank did not,
    with its collective and the ranks that did not reach it; None when every rank is level
    (all last seqs equal). A rank "reached" seq s when its last recorded seq is >= s (its
    ring buffer may have dropped s itself); sequence numbers are per process group and go up
    by one per collective on every rank. When every buffer has dropped the stuck collective,
    its name is unknown: ``(seq, None, ranks)``, never None (the ranks are not level)."""
    last = {rank: max((seq for seq, _ in entries), default=0)
            for rank, entries in records.items()}
    stuck_at = min(last.values()) + 1
    if stuck_at > max(last.values()):
        return None
    names = {seq: name for entries in records.values() for seq, name in entries}
    behind = sorted(rank for rank, seq in last.items() if seq < stuck_at)
    return stuck_at, names.get(stuck_at), behind


def random_records(rng: random.Random, first_collective_stuck: bool = False):
    """Records of ``world`` ranks and the answer: every rank issued collectives 1..k-1, the
    ranks not in ``missing`` also k (and, when some rank is stuck, maybe a few async ones
    after), each record cut to its newest ``capacity`` entries like a ring buffer. With
    ``first_collective_stuck`` the very first collective is the stuck one: the missing ranks'
    records are empty; without it every record holds an entry (k >= 2), so a wrong answer
    meets its own mistake before the empty record that the check's last trial draws."""
    world = rng.randint(2, 8) if first_collective_stuck else rng.randint(1, 8)
    k = 1 if first_collective_stuck else rng.randint(2, 12)
    names = {seq: rng.choice(NAMES) for seq in range(1, k + 4)}
    least = 1 if first_collective_stuck else 0
    missing = sorted(rng.sample(range(world), rng.randint(least, world - 1))) if world > 1 \
        else []
    capacity = rng.randint(2, 6)
    witness = rng.choice([rank for rank in range(world) if rank not in missing])
    records = {}
    for rank in range(world):
        ahead = rng.randint(0, 3) if missing else 0  # async ones after the stuck one
        last = k - 1 if rank in missing else k + ahead
        first = max(1, last + 1 - rng.randint(1, capacity))
        if rank == witness:  # one record still holds the stuck collective, to name it
            first = min(first, k)
        records[rank] = [(seq, names[seq]) for seq in range(first, last + 1)]
    answer = (k, names[k], missing) if missing else None
    return records, answer


def full_buffers(rng: random.Random):
    """Records whose ring buffers are all full, so every list has the same length, while some
    ranks are one collective behind: the case where lengths look level and are not. Random
    trials draw it too rarely to count on (a check passed such an answer about once in 100)."""
    world, capacity = rng.randint(2, 8), rng.randint(2, 6)
    k = rng.randint(capacity + 1, 12)
    names = {seq: rng.choice(NAMES) for seq in range(1, k + 1)}
    missing = sorted(rng.sample(range(world), rng.randint(1, world - 1)))
    records = {rank: [(seq, names[seq]) for seq in range(last + 1 - capacity, last + 1)]
               for rank, last in ((r, k - 1 if r in missing else k) for r in range(world))}
    return records, (k, names[k], missing)


def stuck_dropped(rng: random.Random):
    """Records in which every ring buffer has dropped the stuck collective k: the ranks that
    reached it went on with async ones and kept only later entries, the others stopped at
    k - 1. Not level, and the name of k is unknown: the answer is ``(k, None, missing)``."""
    world, capacity = rng.randint(2, 8), rng.randint(2, 4)
    k = rng.randint(2, 10)
    names = {seq: rng.choice(NAMES) for seq in range(1, k + capacity + 3)}
    missing = sorted(rng.sample(range(world), rng.randint(1, world - 1)))
    records = {}
    for rank in range(world):
        if rank in missing:
            last, first = k - 1, max(1, k - rng.randint(1, capacity))
        else:
            last = k + capacity + rng.randint(0, 2)
            first = last + 1 - capacity                      # > k: k was dropped
        records[rank] = [(seq, names[seq]) for seq in range(first, last + 1)]
    return records, (k, None, missing)


def _trials(rng: random.Random):
    """The check's records in order: full buffers first, then buffers that all dropped the
    stuck collective, then random ones, the last with ranks stuck at the very first
    collective (empty records)."""
    yield full_buffers(rng)
    yield stuck_dropped(rng)
    for trial in range(TRIALS):
        yield random_records(rng, first_collective_stuck=trial == TRIALS - 1)


def check_first_unjoined(fn) -> str:
    seed = new_seed()
    trials = list(_trials(random.Random(seed)))
    got = answers(fn, [(records,) for records, _ in trials], plain_answer,
                  where=f"(seed {seed})")
    for (records, want), (how, answer) in zip(trials, got):
        if how == "raised":
            empty = [rank for rank, entries in records.items() if not entries]
            said = (f" Ranks {empty} recorded nothing: they never reached the first "
                    "collective." if empty else "")
            raise ExerciseFailed(f"(seed {seed}) on records {records} your function raised "
                                 f"{answer}; expected {want!r}.{said}")
        if answer != want:
            raise ExerciseFailed(
                f"(seed {seed}) records (rank: [(seq, collective), ...]) {records}: expected "
                f"{want!r}, got {answer!r}. The ring buffer keeps only the newest entries, so "
                "compare the LAST seq of each rank, not the lengths; the stuck collective is "
                "one past the smallest last seq (its name None when no record still holds "
                "it); None only when all ranks are level.")
    return (f"the stuck collective and its missing ranks in {TRIALS + 2} records: full "
            f"buffers, buffers that all dropped it, then random ones (seed {seed})")


def plain_answer(got):
    """In the rank: the learner's answer as plain data, ``(seq, name, sorted ranks)`` from
    whatever sequence they returned, None, or :class:`Other`."""
    if got is None:
        return None
    if type(got) not in (tuple, list) or len(got) != 3:
        return other(got)
    seq, name, ranks = got
    if (type(seq) is not int or (name is not None and type(name) is not str)
            or type(ranks) not in (list, tuple, set)
            or any(type(rank) is not int for rank in ranks)):
        return other(got)
    return seq, name, sorted(ranks)


EXERCISES = (
    Exercise(
        name="08b.first_unjoined",
        notebook="08b_debugging_today",
        summary="my_first_unjoined(records): (seq, collective, ranks that never joined) of "
                "the first collective not every rank reached (collective None when no record holds "
                "it), or None when level",
        hint="a ring buffer drops a rank's oldest entries, so neither the lengths nor the "
             "first entries say how far a rank got; its newest entry does, and sequence "
             "numbers go up by one per collective on every rank. A rank may have recorded "
             "nothing at all, and every buffer may have dropped the stuck collective itself.",
        recipe="last = {rank: max((seq for seq, _ in entries), default=0) for rank, entries "
               "in records.items()}; stuck = min(last.values()) + 1; if stuck > "
               "max(last.values()): return None (every rank is level); names = {seq: name "
               "for entries in records.values() for seq, name in entries}; return (stuck, "
               "names.get(stuck), sorted(rank for rank, seq in last.items() if seq < "
               "stuck)).",
        solution=first_unjoined,
        checker=check_first_unjoined,
    ),
)
