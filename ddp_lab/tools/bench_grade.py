"""``ddp-lab bench grade``: a class of submissions graded as an instructor would, timed.

Each submission is a folder of the three notebooks whose exercises the test class uses
(00, 02, 03: four exercises), some solved (the reference solutions' source, as
``ddp-lab notebooks --solved`` fills them) and some left as shipped, in a pattern that gives
every score from 0 to 4 (so "solved" and "not attempted" both cost what they cost in a
class). The figure is the wall time of ``grade_class`` on all of them with ``--jobs``
submissions at once, and the seconds per submission; the target (issue 45) is 20
submissions in under 10 minutes on 2 cores. There is no peer to compare with: no other
grader runs notebooks on N real ranks. The grades are checked too: a figure of a grade
that got the scores wrong would measure nothing.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

import nbformat

TARGET_S = 600.0  # 20 submissions, 2 cores
NOTEBOOKS = ("00_launching_from_jupyter", "02_point_to_point", "03_collectives")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("-n", "--submissions", type=int, default=20, help="submissions in the class")
    p.add_argument("--jobs", type=int, default=None,
                   help="submissions graded at once (default: this machine's cores)")
    p.add_argument("--out", type=Path, default=None,
                   help="keep the grades here (default: a temporary folder, removed)")


def make_class(folder: Path, count: int, course: Path) -> dict[str, int]:
    """``count`` submissions under ``folder``; returns each one's expected score."""
    from ddp_lab.tools.solved import exercise_cells, solved_copy
    shipped = {name: nbformat.read(course / f"{name}.ipynb", as_version=4)
               for name in NOTEBOOKS}
    expected = {}
    for i in range(count):
        name = f"learner{i:03d}"
        (folder / name).mkdir()
        solved = {n for k, n in enumerate(NOTEBOOKS) if (i >> k) & 1 or i % 5 == 0}
        for n, nb in shipped.items():
            out = nbformat.from_dict(solved_copy(nb)) if n in solved else nb
            nbformat.write(out, folder / name / f"{n}.ipynb")
        expected[name] = sum(len(exercise_cells(shipped[n])) for n in solved)
    return expected


def main(args: argparse.Namespace) -> int:
    from ddp_lab.grading.grade import grade_class
    from ddp_lab.grading.submission import COURSE_DIR
    if args.submissions < 1:
        print("ddp-lab bench grade: --submissions must be at least 1")
        return 2
    jobs = args.jobs or os.cpu_count() or 1
    with tempfile.TemporaryDirectory(prefix="ddp-lab-bench-grade-") as work:
        expected = make_class(Path(work), args.submissions, COURSE_DIR)
        out = args.out or Path(work) / "grades"
        print(f"grading {args.submissions} submissions (3 notebooks, 4 exercises each), "
              f"{jobs} at a time, on {os.cpu_count()} cores ...", flush=True)
        start = time.perf_counter()
        grades = grade_class(sorted(Path(work) / n for n in expected), out, jobs=jobs,
                             progress=lambda line: print(f"  {line}", flush=True))
        seconds = time.perf_counter() - start
    wrong = [g.name for g in grades if g.score != expected[g.name]]
    print(f"\n{len(grades)} submissions in {seconds:.0f} s: {seconds / len(grades):.1f} s "
          f"per submission, {sum(g.seconds for g in grades) / len(grades):.1f} s each "
          f"from start to end")
    scaled = seconds * 20 / len(grades)
    verdict = "met" if scaled < TARGET_S else "MISSED"
    print(f"target: 20 submissions under {TARGET_S:.0f} s on 2 cores: {scaled:.0f} s for 20 "
          f"at this rate ({verdict})")
    if wrong:
        print(f"WRONG grades for {', '.join(wrong)}: see their report.md")
    return 1 if wrong or verdict == "MISSED" else 0
