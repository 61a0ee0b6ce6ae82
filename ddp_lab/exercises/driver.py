"""Running the learner's function on real ranks, and turning what went wrong there into an
:class:`ExerciseFailed` that says where (world size, seed, rank) and what to look at.

Every checker draws a fresh seed per check (:func:`new_seed`) and names it in its messages
and report, so a failure can be replayed; inputs come from ``torch.Generator`` seeded from it.
"""

from __future__ import annotations

import contextlib
import random
import re

import torch

from ddp_lab.exercises.builtins_off import BuiltinSwitchedOff
from ddp_lab.exercises.bytes_sent import naming_mismatches
from ddp_lab.exercises.feedback import keep
from ddp_lab.exercises.feedback_traceback import cut, hidden_note, learners_frames
from ddp_lab.exercises.feedback_values import layout, short, tensor_difference
from ddp_lab.exercises.registry import ExerciseFailed
from ddp_lab.launch.verdict.plain_values import plain_values

WORLD_SIZES = (1, 2, 3, 4)
# A trial on a warm fork server takes well under a second; a learner whose ranks wait for
# each other should hear so, with where each rank waits, within about ten seconds.
HANG_S = 10.0


def new_seed() -> int:
    """A seed for one check: different every time, so no answer can be learnt by heart."""
    return random.SystemRandom().randrange(1, 2 ** 31)


def where(world_size: int, seed: int) -> str:
    """How a message names a trial: "on 3 ranks (seed 1234)"."""
    return f"on {world_size} rank{'s' if world_size != 1 else ''} (seed {seed})"


def generator(seed: int, *salt: int) -> torch.Generator:
    """A generator for one (seed, rank, round, ...): the same numbers on a replay."""
    return torch.Generator().manual_seed(hash((seed, *salt)) % 2 ** 63)


def random_tensor(seed: int, rank: int) -> torch.Tensor:
    """This rank's input: a shape, dtype and values that only the check's seed number decides."""
    same_everywhere = generator(seed)
    dims = int(torch.randint(1, 3, (1,), generator=same_everywhere))
    shape = tuple(int(s) for s in torch.randint(1, 5, (dims,), generator=same_everywhere))
    dtype = (torch.int64, torch.float32)[seed % 2]
    return (torch.randn(shape, generator=generator(seed, rank)) * 100).to(dtype)


def full_bits_tensor(seed: int, world_size: int, *salt: int) -> torch.Tensor:
    """A tensor for one trial: a shape the check's seed number decides (the same for every
    salt), int64 or float32 by the world size (a check over several world sizes meets both, so a buffer made
    with the default dtype fails every time, not on odd seeds), values that need all their
    bits (an int16 or a float16 copy changes them). ``salt`` (a rank, a chunk) picks values."""
    same = generator(seed)
    dims = int(torch.randint(1, 4, (1,), generator=same))
    shape = tuple(int(s) for s in torch.randint(1, 6, (dims,), generator=same))
    if (seed + world_size) % 2 == 0:
        return torch.randint(-2 ** 40, 2 ** 40, shape, generator=generator(seed, *salt))
    return torch.randn(shape, generator=generator(seed, *salt)) * 1000


def run_ranks(worker, world_size: int, args=(), *, where: str, hang_hint: str = "",
              timeout: float = HANG_S, explain=None) -> list:
    """``ddp_lab.run(worker, world_size, args)``'s values, or ExerciseFailed.

    ``where`` says which trial this was ("on 3 ranks, seed 1234"). A NotImplementedError
    raised by the learner's code on any rank is re-raised as such: the check then says
    "not solved yet" instead of failing. ``explain(err)``, if given, reads the
    WorkerError or WorkerTimeout (every rank's output is in ``err.logs``) and may return what
    went wrong, in words (a process that aborted leaves no Python traceback, only what it
    printed): it leads the message.
    """
    import ddp_lab
    try:
        with plain_values():  # the ranks ran the learner's code: nothing of it runs here
            return ddp_lab.run(worker, world_size=world_size, args=args, backend="gloo",
                               timeout=timeout, echo=False).values
    except ddp_lab.UnreadableResult as err:
        raise ExerciseFailed(
            f"{where}, rank {err.rank}: what your function returned is not plain data "
            f"({err.reasons[err.rank]}): return Python numbers, strings, lists, tuples, "
            "dicts or torch tensors, not objects of a class of your own") from None
    except ddp_lab.WorkerTimeout as err:
        said = (f"{where}: your function hung (ranks {err.stuck_ranks} still waiting after "
                f"{timeout:g} s). {hang_hint}").rstrip()
        keep(said, traceback=_all_stacks(err))
        failure = ExerciseFailed(f"{said}\n\n{_stacks(err)}")
        raise _explained(failure, err, where, explain) from None
    except ddp_lab.WorkerError as err:
        raise _explained(_failure(err, where, hang_hint), err, where, explain) from None


def each_world(trial, args, judge=None, seed: int = 0, *, sizes=WORLD_SIZES, place=None,
               judge_world=None, journaled: bool = False, hang_hint: str = "", explain=None,
               timeout: float = HANG_S) -> dict[int, list]:
    """The checker loop, written once: ``trial`` on each world size in ``sizes``, every
    rank's value judged, the first problem raised as ExerciseFailed naming the trial.

    ``args``: the trial's arguments, a tuple or ``args(n)`` for world size n. ``place(n)``
    names the trial in messages (default ``where(n, seed)``). ``judge_world(values, n)``
    sees every rank's value at once, ``judge(value, rank, n)`` one rank's; each returns None
    or the problem in words, raised as "<place>: <problem>" ("<place>, rank r: <problem>");
    a problem that starts with a comma, a colon or a space goes on the place's sentence.
    With ``journaled`` each world runs in :func:`naming_mismatches` (its journal folder is
    the trial's last argument, and ``explain(err, n, journal)`` may read it). Returns the
    values by world size, for a checker that reports from them.
    """
    seen = {}
    for n in sizes:
        at = place(n) if place else where(n, seed)
        with (naming_mismatches() if journaled else contextlib.nullcontext()) as journal:
            trial_args = tuple(args(n) if callable(args) else args)
            if journaled:
                trial_args += (journal,)
            said = (lambda err, n=n, journal=journal: explain(err, n, journal)) if explain \
                else None
            values = run_ranks(trial, n, trial_args, where=at, hang_hint=hang_hint,
                               timeout=timeout, explain=said)
            _judged(values, n, at, judge, judge_world)
        seen[n] = values
    return seen


def _judged(values: list, n: int, at: str, judge, judge_world) -> None:
    problem = judge_world(values, n) if judge_world else None
    if problem:
        raise ExerciseFailed(_placed(at, problem))
    for rank, value in enumerate(values if judge else ()):
        problem = judge(value, rank, n)
        if problem:
            raise ExerciseFailed(_placed(f"{at}, rank {rank}", problem))


def _placed(at: str, problem: str) -> str:
    return f"{at}{problem}" if problem[:1] in (",", ":", " ") else f"{at}: {problem}"


def _explained(failure: Exception, err, where: str, explain) -> Exception:
    """With ``explain``: its words first, then the failure."""
    if not explain or not isinstance(failure, ExerciseFailed):
        return failure
    said = explain(err)
    return ExerciseFailed(f"{where}: {said}\n\n{failure}" if said else str(failure))


def _abort_reason(err) -> str:
    """What ``std::terminate`` printed before the abort, on the sentence: the C++ exception's
    type and its "what()" message (torch's or gloo's)."""
    logs = list(getattr(err, "logs", None) or [])
    log = logs[err.rank] if 0 <= err.rank < len(logs) else ""
    lines = log.splitlines()
    start = next((i for i, line in enumerate(lines) if line.startswith("terminate called")),
                 None)
    if start is None:
        return "."
    end = next((i for i in range(start, len(lines)) if lines[i].startswith("Fatal Python")),
               len(lines))
    said = "\n".join(lines[start:end]).strip()
    thrown = re.match(r"terminate called after throwing an instance of '([^']+)'\s*"
                      r"what\(\):\s*(.*)", said, re.S)
    if thrown is None:
        return f", which said:\n{said}"
    return f" ({thrown[1]}), which said: {thrown[2].strip()}"


def last_line(traceback: str) -> str:
    lines = [line for line in (traceback or "").splitlines() if line.strip()]
    return lines[-1].strip() if lines else "(no traceback)"


def raised(traceback: str) -> str:
    """The exception a traceback ends with, whole: torch's messages often run over several
    lines (a shape mismatch, a gloo error with its cause), and its last line alone is a
    fragment. Everything after the last frame's source line."""
    lines = (traceback or "").rstrip().splitlines()
    frames = [i for i, line in enumerate(lines) if line.startswith("  ")]
    start = next((i for i in range(frames[-1] + 1 if frames else 0, len(lines))
                  if lines[i].strip() and not lines[i].startswith(" ")), None)
    return "\n".join(lines[start:]).strip() if start is not None else last_line(traceback)


def _failure(err, where: str, hang_hint: str) -> Exception:
    traceback = err.traceback or ""
    if not traceback.strip():  # it left early, or crashed without Python's help
        first = str(err).strip().splitlines()[0]
        return ExerciseFailed(f"{where}: {first} {hang_hint}".rstrip())
    if traceback.lstrip().startswith("Fatal Python error"):
        # A process that C++ aborted: only the rank's output has what the C++ exception
        # said; its "traceback" is faulthandler's stack, from which raised() takes nothing.
        return _with_frames(f"{where}: rank {err.rank}'s process was aborted by C++ code "
                            f"under torch{_abort_reason(err)}", traceback)
    error = raised(traceback)
    if error.startswith("NotImplementedError"):
        return NotImplementedError(error)
    refused = BuiltinSwitchedOff.__name__
    if error.startswith(refused) or f".{refused}:" in error:
        return ExerciseFailed(f"{where}, rank {err.rank}: {error.split(': ', 1)[-1]}")
    return _with_frames(f"{where}, rank {err.rank} raised {error}", traceback)


def _with_frames(said: str, traceback: str) -> ExerciseFailed:
    """``said``, then the traceback cut to the learner's frames (the whole one is kept)."""
    keep(said, traceback=traceback)
    return ExerciseFailed(f"{said}\n\n{cut(traceback)}")


def _stacks(err) -> str:
    """Where each stuck rank waited, in the learner's frames; ranks that wait at the same
    line are listed once."""
    stacks = getattr(err, "stacks", {}) or {}
    waits: dict[tuple[str, ...], list[int]] = {}
    hidden = 0
    for rank, stack in sorted(stacks.items()):
        frames = learners_frames(stack)
        waits.setdefault(frames.lines, []).append(rank)
        hidden += frames.hidden
    if not waits:
        return "(no stacks)"
    blocks = [f"rank{'s' if len(ranks) > 1 else ''} {', '.join(map(str, ranks))}:\n"
              + "\n".join(lines) for lines, ranks in waits.items()]
    note = f" ({hidden_note(hidden)})" if hidden else ""
    return f"Where each stuck rank waited{note}:\n" + "\n".join(blocks)


def _all_stacks(err) -> str:
    stacks = getattr(err, "stacks", {}) or {}
    return "\n".join(f"rank {rank}:\n{stack.rstrip()}" for rank, stack in
                     sorted(stacks.items()))


def tensor_problem(got, want: torch.Tensor, exact: bool = True, mine=None) -> str | None:
    """None if ``got`` is ``want`` (dtype, shape, values), else what differs, in one line:
    the layout, the first differing element (index, both values), how many differ, and
    "you returned your own tensor" when ``got`` equals ``mine`` (the rank's input). The
    full tensors go to ``ex.last_failure()``."""
    problem = tensor_difference(got, want, exact, mine)
    if mine is None:
        return keep(problem, expected=want, got=got)
    return keep(problem, expected=want, got=got, input=mine)


def number_problem(got, want: float, what: str = "a number", rel: float = 1e-6) -> str | None:
    """None if ``got`` is a Python number close to ``want``; else what is wrong, in words: a
    tensor where a number is expected is said plainly, with the fix."""
    if isinstance(got, torch.Tensor):
        return (f"expected {what} (a Python float), got a tensor of {layout(got)}: return "
                f"tensor.item() for a one-element tensor")
    if isinstance(got, bool) or not isinstance(got, (int, float)):
        return f"expected {what} (a Python float), got {type(got).__name__} {got!r}"
    if abs(got - want) > rel * max(1.0, abs(want)):
        return keep(f"expected {what} {want!r}, got {got!r}", expected=want, got=got)
    return None


def describe(value) -> str:
    """A value in a few words, for a message (a large tensor by its dtype and shape)."""
    return short(value)
