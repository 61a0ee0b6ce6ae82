"""The instructor's ``ddp-lab assign``: the course exported for nbgrader, Otter-Grader or
Gradescope (ddp_lab/grading/export; docs/assign.md)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ddp_lab.tools.cli.formatting import add_command

FORMATS = ("nbgrader", "otter", "gradescope")  # ddp_lab.grading.export.FORMATS, unimported here


def add_assign(sub) -> None:
    p = add_command(
        sub, "assign", "export the course for nbgrader, Otter-Grader or Gradescope",
        "Write the course's exercises in a grading tool's format, with each exercise's "
        "points and visibility from the course's registry. nbgrader: OUT/nbgrader_config.py "
        "and OUT/source/NB/NB.ipynb, the exercise cells as solution cells (the reference "
        "solution between nbgrader's markers), each check cell an autograded test with a "
        "hidden strict check, every other cell locked; then `nbgrader generate_assignment "
        "NB` and `nbgrader autograde NB` in OUT. otter: OUT/NB/NB.ipynb, a master notebook "
        "for `otter assign`. gradescope: OUT/autograder.zip, whose run_autograder calls "
        "`ddp-lab grade` on the submission (with this checkout's wheel and notebooks).")
    p.add_argument("--format", required=True, choices=FORMATS, dest="fmt",
                   help="the grading tool")
    p.add_argument("--out", required=True, type=Path, help="folder to write into")
    p.add_argument("--dir", default="notebooks", type=Path,
                   help="the course's notebooks (gradescope packs them all in the zip)")
    p.add_argument("--pattern", default="*.ipynb",
                   help="glob of the notebooks to export, e.g. '02*' (nbgrader, otter)")
    p.set_defaults(handler=_cmd_assign)


def _cmd_assign(args: argparse.Namespace) -> int:
    from ddp_lab.grading.export import export
    try:
        written = export(args.fmt, args.dir, args.out, args.pattern)
    except (ValueError, RuntimeError) as exc:
        print(f"ddp-lab assign: {exc}", file=sys.stderr)
        return 2
    for path in written:
        print(path)
    return 0
