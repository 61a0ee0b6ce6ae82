"""The ``ddp-lab`` command: one small function registers each subcommand
(``course_commands``: doctor, run, notebooks, progress; ``bench_commands``: bench), and
``formatting`` lays out every help page the same way.

Subcommands import their module inside the handler, so ``ddp-lab notebooks`` and every
``--help`` start without importing torch or the launcher.
"""

from __future__ import annotations

import argparse
from typing import Callable, Sequence

from ddp_lab.tools.cli.assign_commands import add_assign
from ddp_lab.tools.cli.bench_commands import add_bench
from ddp_lab.tools.cli.course_commands import add_doctor, add_notebooks, add_progress, add_run
from ddp_lab.tools.cli.formatting import HelpFormatter
from ddp_lab.tools.cli.grade_commands import add_grade

Registrar = Callable[["argparse._SubParsersAction"], None]

REGISTRARS: tuple[Registrar, ...] = (add_doctor, add_run, add_notebooks, add_progress, add_assign,
                                     add_bench, add_grade)

DESCRIPTION = """\
The ddp-lab course: PyTorch distributed, launched from Jupyter. The course itself is in
notebooks/ (jupyter lab notebooks/); these commands check the machine, run the course's
demos and notebooks, show your progress and measure the launcher."""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="ddp-lab", description=DESCRIPTION, formatter_class=HelpFormatter,
        epilog="`ddp-lab COMMAND --help` describes a command and its options.")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for register in REGISTRARS:
        register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``ddp-lab`` and ``python -m ddp_lab``; returns the exit code."""
    args = build_parser().parse_args(argv)
    return args.handler(args)
