"""The instructor's command: ``ddp-lab grade SUBMISSION... --out DIR`` (ddp_lab/grading/).

The handler imports the grader when it runs, so ``--help`` starts without torch.
"""

from __future__ import annotations

import argparse
import signal
import sys
from pathlib import Path

from ddp_lab.tools.cli.formatting import add_command


def add_grade(sub) -> None:
    p = add_command(
        sub, "grade", "grade a class's notebooks with the course's checkers",
        "Grade each submission (a course notebook as a learner saved it, or a folder of "
        "them): its notebooks run in a fresh kernel in a sandbox (its own folder, no "
        "network, time and memory budgets), each exercise function is checked on real "
        "ranks in a second sandboxed process with the course's checkers and seeds of "
        "the grade's own. Writes DIR/NAME/results.json (Gradescope's format) and "
        "DIR/NAME/report.md per submission, DIR/grades.csv and DIR/summary.html for the "
        "class. docs/grading.md says what runs and what a hostile submission gets.")
    p.add_argument("submissions", nargs="+", type=Path, metavar="SUBMISSION",
                   help="a notebook (.ipynb) or a folder of them, per submission")
    p.add_argument("--out", required=True, type=Path, help="folder for the results")
    p.add_argument("--jobs", type=int, default=None,
                   help="submissions graded at once (default: this machine's cores)")
    p.add_argument("--results-json", type=Path, default=None,
                   help="also write the one submission's results.json here (Gradescope's "
                        "/autograder/results/results.json)")
    p.add_argument("--course", type=Path, default=None,
                   help="folder of the shipped notebooks (default: this ddp_lab's notebooks/)")
    p.add_argument("--cell-timeout", type=float, default=60.0,
                   help="seconds one cell of a submission's kernel may run")
    p.add_argument("--kernel-timeout", type=float, default=240.0,
                   help="seconds a submission's kernel may run, per notebook")
    p.add_argument("--check-timeout", type=float, default=120.0,
                   help="seconds the checks may take, per exercise")
    p.add_argument("--memory-gib", type=float, default=8.0,
                   help="memory budget of each sandboxed process, GiB")
    p.set_defaults(handler=_cmd_grade)


def _cmd_grade(args: argparse.Namespace) -> int:
    from ddp_lab.grading.grade import grade_class
    from ddp_lab.grading.one_submission import GIB, Budgets
    from ddp_lab.grading.submission import COURSE_DIR
    signal.signal(signal.SIGTERM, _interrupted)  # stop the sandboxes, remove the folders
    try:
        budgets = Budgets(cell_s=args.cell_timeout, kernel_s=args.kernel_timeout,
                          check_s=args.check_timeout,
                          memory_bytes=int(args.memory_gib * GIB))
        grades = grade_class(args.submissions, args.out, jobs=args.jobs, budgets=budgets,
                             course_dir=args.course or COURSE_DIR,
                             results_json=args.results_json)
    except (ValueError, FileNotFoundError) as exc:
        print(f"ddp-lab grade: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("ddp-lab grade: interrupted; the submissions graded so far have their "
              f"results in {args.out}", file=sys.stderr)
        return 130
    print(f"{len(grades)} submission{'s' if len(grades) != 1 else ''} graded: "
          f"{args.out / 'grades.csv'}, {args.out / 'summary.html'}")
    return 0


def _interrupted(signum, frame):
    raise KeyboardInterrupt(f"signal {signum}")
