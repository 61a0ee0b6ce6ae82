"""A learner's progress over runs, kept in ``build/progress.json``: for each exercise, what
its latest check said, when it was first and last solved, and how often it was checked.

Why a store of its own, apart from the front page's ``index.json``: the page shows the
latest run of each notebook, and a re-run where an exercise fails again (a learner trying
a variant, or resetting a cell) must not erase that it was solved last Tuesday. Only the
learner's own checks count (tools/exercise_status.py); a run in solved mode
(``--solved``) checks the references and records nothing. ``ddp-lab progress`` prints it.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from ddp_lab.tools.exercise_status import NOT_CHECKED, SOLVED, CheckResult

STORE_NAME = "progress.json"
STORE_FORMAT = 1
NEVER = "never checked"


@dataclass(frozen=True)
class ExerciseProgress:
    """One exercise over runs; times are ``local_time`` strings, "" for never."""

    name: str
    notebook: str
    status: str  # what the latest check said (exercise_status: solved, not solved yet, ...)
    feedback: str
    checked_at: str
    first_solved_at: str = ""
    last_solved_at: str = ""
    checks: int = 0

    @property
    def ever_solved(self) -> bool:
        return bool(self.first_solved_at)


def local_time(epoch: float) -> str:
    """A time of day a learner reads at a glance: "2026-11-28 22:05" in local time."""
    return time.strftime("%Y-%m-%d %H:%M", time.localtime(epoch))


Check = tuple[str, str, CheckResult, float]  # (exercise, notebook, result, when: epoch s)


def record(build_dir: Path | str, checks: list[Check]) -> dict[str, ExerciseProgress]:
    """Merge this run's ``checks`` into the store; an exercise this run did not check
    keeps what it had. Returns the whole progress, by name."""
    progress = load(build_dir)
    for name, notebook, result, when in checks:
        if result.status != NOT_CHECKED:
            progress[name] = _updated(progress.get(name), name, notebook, result,
                                      local_time(when))
    _save(build_dir, progress)
    return progress


def _updated(old: ExerciseProgress | None, name: str, notebook: str, result: CheckResult,
             at: str) -> ExerciseProgress:
    old = old or ExerciseProgress(name, notebook, NOT_CHECKED, "", "")
    solved = result.status == SOLVED
    return replace(old, notebook=notebook, status=result.status, feedback=result.feedback,
                   checked_at=at, checks=old.checks + 1,
                   first_solved_at=old.first_solved_at or (at if solved else ""),
                   last_solved_at=at if solved else old.last_solved_at)


def load(build_dir: Path | str) -> dict[str, ExerciseProgress]:
    """The stored progress by exercise name; empty for a first run or a store that is
    not ours (another format, damaged): the next run starts it again."""
    try:
        data = json.loads((Path(build_dir) / STORE_NAME).read_text(encoding="utf-8"))
        if data.get("format") != STORE_FORMAT:
            return {}
        return {name: ExerciseProgress(**e) for name, e in data["exercises"].items()}
    except (OSError, ValueError, AttributeError, KeyError, TypeError):
        return {}


def _save(build_dir: Path | str, progress: dict[str, ExerciseProgress]) -> None:
    """Written whole to a temporary file, then renamed: an interrupted run leaves the old
    store, never half of one."""
    store = Path(build_dir) / STORE_NAME
    store.parent.mkdir(parents=True, exist_ok=True)
    payload = {"format": STORE_FORMAT,
               "exercises": {name: asdict(p) for name, p in sorted(progress.items())}}
    partial = store.with_suffix(".json.partial")
    partial.write_text(json.dumps(payload, indent=1), encoding="utf-8")
    partial.replace(store)


def solved_count(progress: dict[str, ExerciseProgress]) -> int:
    return sum(p.ever_solved for p in progress.values())


def table(progress: dict[str, ExerciseProgress], names: list[str]) -> str:
    """What ``ddp-lab progress`` prints: one row per exercise in ``names`` (the course's,
    in notebook order), then the total."""
    rows = [("exercise", "latest check", "solved on", "checked on", "checks")]
    for name in names:
        p = progress.get(name)
        rows.append((name, NEVER, "-", "-", "0") if p is None else (
            name, p.status, p.first_solved_at or "-", p.checked_at, str(p.checks)))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip()
             for row in rows]
    solved = sum(progress[n].ever_solved for n in names if n in progress)
    lines.append(f"\n{solved} of {len(names)} exercises solved.")
    return "\n".join(lines)


def feedback_lines(progress: dict[str, ExerciseProgress], names: list[str]) -> str:
    """The latest feedback of each exercise that is not solved now (what to look at next)."""
    return "\n".join(f"  {name}: {progress[name].feedback}" for name in names
                     if name in progress and progress[name].status != SOLVED
                     and progress[name].feedback)
