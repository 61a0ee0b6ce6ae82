"""``ddp-lab grade SUBMISSION... --out DIR``: a class graded, several submissions at a time.

Each submission is graded on its own (one_submission.py: a sandboxed kernel, then a
sandboxed check), ``jobs`` of them at once (default: this machine's cores); each writes
``DIR/NAME/results.json`` and ``DIR/NAME/report.md`` as soon as it is done, and the class
gets ``DIR/grades.csv`` and ``DIR/summary.html`` at the end. A submission's name is its
file's stem or its folder's name, made unique (``alice``, ``alice-2``).
"""

from __future__ import annotations

import os
import re
import signal
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Callable

from ddp_lab.grading.class_report import write_grades_csv, write_summary_html
from ddp_lab.grading.one_submission import Budgets, grade_submission
from ddp_lab.grading.results import SubmissionGrade, write_results_json, write_submission
from ddp_lab.grading.sandbox import HELPER as SANDBOX_HELPER
from ddp_lab.grading.submission import COURSE_DIR, read_submission

Progress = Callable[[str], object]


def submission_names(paths: list[Path]) -> list[str]:
    """A folder name for each submission: its stem, safe for a path, unique."""
    names: list[str] = []
    for path in paths:
        base = re.sub(r"[^\w.-]+", "_", path.stem if path.is_file() else path.name) or "x"
        name, n = base.lstrip(".") or "x", 1
        while name in names:
            n += 1
            name = f"{base}-{n}"
        names.append(name)
    return names


def stop_sandboxes() -> None:
    """End the sandboxes this process started and still waits for. Ctrl-C reaches only
    this process's main thread (each sandbox runs in a session of its own, so the terminal
    does not signal it); a worker thread waits in ``run_sandboxed`` until its sandbox ends,
    so end it now: its helper, told SIGTERM, kills the sandbox's whole PID namespace, and
    ``run_sandboxed`` returns."""
    import psutil
    helper = str(SANDBOX_HELPER)
    for child in psutil.Process().children():
        try:
            if helper in child.cmdline():
                child.send_signal(signal.SIGTERM)
        except psutil.Error:  # it ended meanwhile
            pass


def check_paths(paths: list[Path]) -> None:
    """Bad input says what to do before anything runs."""
    if not paths:
        raise ValueError("name at least one submission: a notebook or a folder of them")
    missing = [str(p) for p in paths if not p.exists()]
    if missing:
        raise FileNotFoundError(f"no such submission: {', '.join(missing)}")


def grade_class(paths: list[Path], out_dir: Path, *, jobs: int | None = None,
                budgets: Budgets = Budgets(), course_dir: Path = COURSE_DIR,
                results_json: Path | None = None,
                progress: Progress = print) -> list[SubmissionGrade]:
    """Grade every submission in ``paths``; write their files and the class's under
    ``out_dir``. ``results_json``: also write the (single) submission's results.json there
    (Gradescope's ``/autograder/results/results.json``)."""
    paths = [Path(p) for p in paths]
    check_paths(paths)
    if results_json is not None and len(paths) != 1:
        raise ValueError("--results-json writes one submission's results: name exactly one")
    jobs = (os.cpu_count() or 1) if jobs is None else jobs
    if jobs < 1:
        raise ValueError(f"--jobs must be at least 1, got {jobs}")
    out_dir.mkdir(mode=0o700, parents=True, exist_ok=True)  # grades are the instructor's
    names = submission_names(paths)
    hidden = tuple(p.resolve() for p in [*paths, out_dir])  # no submission reads another

    def one(path_and_name) -> SubmissionGrade:
        path, name = path_and_name
        grade = grade_submission(read_submission(path, name, course_dir), budgets, hidden)
        write_submission(grade, out_dir / name)
        progress(f"{name}: {grade.score:g} / {grade.max_score:g} "
                 f"({grade.seconds:.0f} s)")
        return grade

    pool = ThreadPoolExecutor(max_workers=jobs)
    try:
        grades = list(pool.map(one, zip(paths, names)))
    except BaseException:  # Ctrl-C, SIGTERM made an exception: stop the running ones
        pool.shutdown(wait=False, cancel_futures=True)
        stop_sandboxes()
        raise
    finally:
        pool.shutdown(wait=True)
    write_grades_csv(grades, out_dir / "grades.csv")
    write_summary_html(grades, out_dir / "summary.html")
    if results_json is not None:
        write_results_json(grades[0], results_json)
    return grades
