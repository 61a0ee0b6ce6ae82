"""Notebook 09b's exercise: which physical GPU is ``cuda:LOCAL_RANK`` under a
``CUDA_VISIBLE_DEVICES`` value?

A pure function, checked in a rank of its own (``answers_in_a_rank``: the checker draws the
settings and keeps the expected GPUs) on random values of the variable (permutations,
subsets, repeats, negative and out-of-range ordinals, spaces, typos, empty, unset) against torch's
own parser ``torch.cuda._parse_visible_devices`` (through the notebook's
``by_hand.visible_devices``, which sets the variable and cuts the list at the first ordinal
the machine lacks, as the driver does). Torch's parser is switched off while the learner's
function runs.
"""

from __future__ import annotations

import random

import torch.cuda

from ddp_lab.exercises.answers_in_a_rank import Other, answers, other
from ddp_lab.course.ch09_torchrun import by_hand
from ddp_lab.exercises.builtins_off import refusing, replaced
from ddp_lab.exercises.driver import new_seed
from ddp_lab.exercises.registry import Exercise, ExerciseFailed

TRIALS = 300


def physical_gpu(visible, local_rank: int, gpus: int):
    """Reference: parse the list as torch does (a repeated ordinal hides every GPU; the
    list stops at the first entry that does not start with a non-negative number, as
    ``_strtoul`` in torch/cuda/__init__.py reads it), then cut
    it at the first ordinal this machine lacks; ``cuda:local_rank`` is its item
    ``local_rank``, or None when the process sees fewer GPUs than that."""
    if visible is None:
        ordinals = list(range(gpus))
    else:
        ordinals = []
        for item in visible.split(","):
            # What torch reads, like C's strtoul: a sign and the digits after it, so "1gpu2"
            # is 1; -1 without digits ("gpu1", "x", "").
            item = item.strip()
            sign = item[:1] if item[:1] in ("+", "-") else ""
            rest = item[len(sign):]
            digits = rest[:len(rest) - len(rest.lstrip("0123456789"))]
            ordinal = int(sign + digits) if digits else -1
            if ordinal in ordinals:
                return None  # a repeat: the driver shows no GPU at all
            if ordinal < 0:
                break
            ordinals.append(ordinal)
    present = []
    for ordinal in ordinals:
        if ordinal >= gpus:
            break
        present.append(ordinal)
    return present[local_rank] if local_rank < len(present) else None


# Typos as the text means them: entries torch reads by their leading digits, or not at all.
TYPOS = ("{k}gpu", "{k}a", "gpu{k}", "x", "", "+{k}")


def random_setting(rng: random.Random, gpus: int):
    """A value of CUDA_VISIBLE_DEVICES: None (unset) now and then, else 0-5 entries drawn
    from the machine's ordinals, one past them, -1 and typos, some with spaces around."""
    if rng.random() < 0.1:
        return None
    pool = list(range(gpus + 2)) + [-1]
    count = rng.randint(0, 5)
    entries = rng.sample(pool, min(count, len(pool))) if rng.random() < 0.7 else \
        [rng.choice(pool) for _ in range(count)]
    entries = [rng.choice(TYPOS).format(k=e) if e >= 0 and rng.random() < 0.2 else str(e)
               for e in entries]
    return ",".join(f" {e}" if rng.random() < 0.2 else e for e in entries)


def expected_gpu(visible, local_rank: int, gpus: int):
    seen = by_hand.visible_devices(visible, gpus=gpus)
    return seen[local_rank] if local_rank < len(seen) else None


def leading_digits_setting(rng: random.Random):
    """``(gpus, visible, local_rank)`` with a typo torch reads by its leading digits
    ("2gpu" is 2) in the middle of the list, and a local rank at or after it: the case
    where reading only whole numbers goes wrong. Random settings draw it too rarely to
    count on (a check passed such an answer about once in 300)."""
    gpus = rng.randint(3, 8)
    first, typo, last = rng.sample(range(gpus), 3)
    visible = f"{first},{rng.choice(('{k}gpu', '{k}a')).format(k=typo)},{last}"
    return gpus, visible, rng.choice((1, 2))


def _trials(rng: random.Random):
    """The check's settings in order: the leading-digits typo first, then random ones."""
    yield leading_digits_setting(rng)
    for _ in range(TRIALS):
        gpus = rng.randint(1, 8)
        yield gpus, random_setting(rng, gpus), rng.randint(0, 3)


def check_physical_gpu(fn) -> str:
    seed = new_seed()
    trials = list(_trials(random.Random(seed)))
    got = answers(fn, [(visible, local_rank, gpus) for gpus, visible, local_rank in trials],
                  plain_gpu, where=f"(seed {seed})", guard=parser_off)
    for (gpus, visible, local_rank), (how, answer) in zip(trials, got):
        want = expected_gpu(visible, local_rank, gpus)
        call = f"my_physical_gpu({visible!r}, local_rank={local_rank}, gpus={gpus})"
        if how == "raised":
            raise ExerciseFailed(f"(seed {seed}) {call} raised {answer}; expected {want!r}")
        if isinstance(want, int) and isinstance(answer, Other) and answer.text == str(want):
            raise ExerciseFailed(f"(seed {seed}) {call} should be the int {want!r}; "
                                 f"got the {answer!r}. Return a Python int (int(...)) or None.")
        if answer != want or type(answer) is not type(want):
            raise ExerciseFailed(
                f"(seed {seed}) {call} should be {want!r}, got {answer!r}. "
                "cuda:k is the k-th visible GPU; a repeated ordinal hides them all, a "
                "negative one or one the machine lacks ends the list, and so does an entry "
                "that does not start with a number (torch reads '1gpu' as 1, like C's "
                "strtoul); None when there is no cuda:local_rank.")
    return (f"the same GPUs as torch's parser on {TRIALS + 1} settings: a typo read by its "
            f"leading digits, then random ones (seed {seed})")


def parser_off():
    """In the rank, around each call: torch's own parser refuses."""
    off = refusing("torch.cuda._parse_visible_devices", "parse the string yourself")
    return replaced(torch.cuda, "_parse_visible_devices", off)


def plain_gpu(got):
    """In the rank: the learner's answer as plain data, an int or None, else :class:`Other`."""
    return got if got is None or type(got) is int else other(got)


EXERCISES = (
    Exercise(
        name="09b.physical_gpu",
        notebook="09b_launching_in_practice",
        summary="my_physical_gpu(visible, local_rank, gpus): the physical GPU behind "
                "cuda:local_rank under CUDA_VISIBLE_DEVICES=visible, or None",
        hint="section 3's rules, in the order torch applies them: read the entries one by "
             "one (torch.cuda._parse_visible_devices in torch/cuda/__init__.py is the model; "
             "note how it reads an entry that is not a clean number), then let the machine's "
             "GPU count cut the list; cuda:k is what is left at k.",
        recipe="If visible is None: ordinals = range(gpus). Else for each item of "
               "visible.split(','): x = the number at the start of item.strip() (optional "
               "sign, then digits: '1gpu' is 1), -1 if there is none; if x is already in the "
               "list return None (a repeat hides every GPU); if x < 0 stop; else append. "
               "Then keep the ordinals up to the first one >= gpus; return item local_rank "
               "of what is left, or None if it is too short.",
        solution=physical_gpu,
        checker=check_physical_gpu,
    ),
)
