"""The second sandboxed process of a grade: each exercise's payload checked on real ranks by
the course's own checker, sealed, with seeds that only this process draws.

    python -m ddp_lab.grading.checking      (in a folder holding job.json and key)

``job.json`` lists ``{"exercise", "payload", "function"}`` (a payload file in the folder,
the name the notebook gives the function). Each payload
is handed to ``exercise.checker(Sealed.from_pickled(payload, exercise, name))``: this
process never unpickles it (unpickling runs code: a payload can name any callable to rebuild
itself); the seal unpickles it inside the sealed call, in the process that calls it (a
rank, usually), where the references are out of reach and the doors closed, and seals a
class method by method. The checkers draw their seeds from
``random.SystemRandom`` here (``driver.new_seed``), never from the notebook's.

The results go to stdout as one line per exercise, signed with HMAC-SHA256 under the key the
grade left in ``key``: the file is read and removed before any check runs, and the key lives
only in :func:`main`'s frame, out of the reach of a learner's function that runs in this
process sealed (frames, gc and files closed), and of the ranks: this process is made
undumpable (:func:`undumpable`), so its memory and descriptors under /proc are closed to
processes of the same user. A line that the learner's code printed, or
one of a process that stopped half-way, does not verify: the grade (:func:`read_results`)
scores what it cannot verify as 0.
"""

from __future__ import annotations

import ctypes
import hashlib
import hmac
import json
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

RESULT_MARK = "ddp-lab-check:"
PASSED, FAILED, NOT_SOLVED, CHECK_ERROR = "passed", "failed", "not solved yet", "check error"
OUTPUT_LINES, OUTPUT_CHARS = 12, 2000
PR_SET_DUMPABLE, PR_GET_DUMPABLE = 4, 3  # <linux/prctl.h>


@dataclass(frozen=True)
class CheckOutcome:
    """What the checker said of one exercise: a status above and its first lines."""

    exercise: str
    status: str
    output: str


def first_lines(text: str) -> str:
    """The feedback's first lines, as a grade shows them."""
    lines = str(text).strip().splitlines()[:OUTPUT_LINES]
    said = "\n".join(lines)
    return said if len(said) <= OUTPUT_CHARS else said[:OUTPUT_CHARS - 3] + "..."


def check_one(exercise_name: str, payload: bytes, function: str) -> CheckOutcome:
    """Run the exercise's checker on the payload, sealed; never raises."""
    from ddp_lab.exercises import NOT_SOLVED as NOT_SOLVED_SAID
    from ddp_lab.exercises.registry import ExerciseFailed, find
    from ddp_lab.exercises.sealed import Sealed
    exercise = find(exercise_name)
    try:
        report = exercise.checker(Sealed.from_pickled(payload, exercise, function))
    except NotImplementedError:
        return CheckOutcome(exercise_name, NOT_SOLVED, f"{NOT_SOLVED_SAID}: the function "
                                                       f"raised NotImplementedError")
    except ExerciseFailed as failure:
        return CheckOutcome(exercise_name, FAILED, first_lines(failure))
    except Exception as exc:  # noqa: BLE001 - a checker that breaks scores 0, says why
        return CheckOutcome(exercise_name, CHECK_ERROR,
                            first_lines(f"the check could not run: {type(exc).__name__}: "
                                        f"{exc}"))
    return CheckOutcome(exercise_name, PASSED, first_lines(report))


def signed_line(outcome: CheckOutcome, key: bytes) -> str:
    body = json.dumps(asdict(outcome), sort_keys=True)
    return f"{RESULT_MARK}{_mac(key, body)} {body}"


def _mac(key: bytes, body: str) -> str:
    return hmac.new(key, body.encode(), hashlib.sha256).hexdigest()


def read_results(stdout: str, key: bytes) -> dict[str, CheckOutcome]:
    """The verified outcomes in a checking process's output, by exercise (the first verified
    line of each wins; anything else, printed by whoever, is ignored)."""
    found: dict[str, CheckOutcome] = {}
    for line in stdout.splitlines():
        if not line.startswith(RESULT_MARK):
            continue
        mac, _, body = line[len(RESULT_MARK):].partition(" ")
        if not hmac.compare_digest(mac, _mac(key, body)):
            continue
        outcome = CheckOutcome(**json.loads(body))
        found.setdefault(outcome.exercise, outcome)
    return found


def undumpable() -> None:
    """Make this process's /proc entries (its memory, which holds the key, and its file
    descriptors) the kernel's own: the ranks run as the same user and could read them
    otherwise. ``PR_SET_DUMPABLE`` 0 (prctl(2)); a child that execs starts dumpable again."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_DUMPABLE, 0) failed")


def main() -> int:
    key_file = Path("key")
    key = bytes.fromhex(key_file.read_text().strip())
    key_file.unlink()
    undumpable()
    job = json.loads(Path("job.json").read_text())
    real_stdout = sys.stdout
    sys.stdout = sys.stderr  # the checkers' and the ranks' prints stay off the results
    for item in job["exercises"]:
        outcome = check_one(item["exercise"], Path(item["payload"]).read_bytes(),
                            item["function"])
        print(signed_line(outcome, key), file=real_stdout, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
