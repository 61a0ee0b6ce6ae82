"""The ``ddp-lab`` command: one small function registers each subcommand.

Subcommands import their module inside the handler, so ``ddp-lab notebooks`` starts
without importing torch or the launcher.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Callable, Sequence

Registrar = Callable[["argparse._SubParsersAction"], None]


# --- notebooks -----------------------------------------------------------------------

def _add_notebooks(sub) -> None:
    p = sub.add_parser("notebooks", help="execute the course notebooks headless in a real kernel")
    p.add_argument("--dir", default="notebooks", type=Path, help="folder with the notebooks")
    p.add_argument("--build", default="build", type=Path, help="where executed copies and HTML go")
    p.add_argument("--pattern", default="*.ipynb", help="glob of the notebooks to run")
    p.add_argument("--timeout", default=300.0, type=float, help="seconds allowed per cell")
    p.set_defaults(handler=_cmd_notebooks)


def _summary_table(reports) -> str:
    width = max(len("notebook"), *(len(r.name) for r in reports))
    lines = [f"{'notebook':<{width}}  status  seconds"]
    for r in reports:
        lines.append(f"{r.name:<{width}}  {'ok' if r.ok else 'FAILED':<6}  {r.seconds:7.1f}")
    return "\n".join(lines)


def _cmd_notebooks(args: argparse.Namespace) -> int:
    from ddp_lab import notebook_runner

    if not notebook_runner.find_notebooks(args.dir, args.pattern):
        print(f"ddp-lab notebooks: no notebooks match {args.pattern!r} in {args.dir}/; "
              "pass --dir (and --pattern) to point at the course folder", file=sys.stderr)
        return 2
    reports = notebook_runner.run_all(args.dir, args.build, args.pattern,
                                      progress=lambda line: print(line, flush=True),
                                      timeout_per_cell=args.timeout)
    print("\n" + _summary_table(reports))
    print(f"\nreport: {(args.build / 'index.html').resolve()}", flush=True)
    failed = [r for r in reports if not r.ok]
    if failed:
        print(f"\n{len(failed)} of {len(reports)} notebooks failed:", file=sys.stderr)
    for r in failed:
        print(f"  {r.describe()}", file=sys.stderr)
    return 1 if failed else 0


# --- doctor (ddp_lab.doctor): not registered yet --------------------------------------

# --- run (ddp_lab.demos): not registered yet -------------------------------------------

# --- bench (ddp_lab.bench): not registered yet -----------------------------------------

# Each subcommand follows _add_notebooks: `_add_<name>(sub)` adds its parser and sets
# `handler=_cmd_<name>`; the handler imports its module inside the function and returns
# the exit code; `_add_<name>` is then appended to REGISTRARS.

REGISTRARS: tuple[Registrar, ...] = (_add_notebooks,)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="ddp-lab", description="The ddp-lab course: PyTorch distributed, launched from Jupyter."
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for register in REGISTRARS:
        register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``ddp-lab`` and ``python -m ddp_lab``; returns the exit code."""
    args = build_parser().parse_args(argv)
    return args.handler(args)
