"""The learner's commands: ``doctor``, ``run``, ``notebooks``, ``progress``.

Each handler imports what it needs when it runs, so ``ddp-lab notebooks`` and every
``--help`` start without importing torch or the launcher.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ddp_lab.tools.cli.formatting import add_command

# --- doctor ----------------------------------------------------------------------------


def add_doctor(sub) -> None:
    p = add_command(
        sub, "doctor", "check torch, the backends and a real 2-rank run",
        "Check that this machine can run the course: Python's and torch's versions, the "
        "backends this torch has (gloo, NCCL, MPI), the usable cores and GPUs, whether each "
        "run gets a private network, a forward and backward in this process, then a real "
        "all_reduce on 2 ranks. Ends with READY or NOT READY and what to do; exits 1 when not ready.")
    p.set_defaults(handler=_cmd_doctor)


def _cmd_doctor(args: argparse.Namespace) -> int:
    from ddp_lab.tools import doctor
    return doctor.main()


# --- run -------------------------------------------------------------------------------

def add_run(sub) -> None:
    p = add_command(
        sub, "run", "run one of the course's demos on N ranks",
        "Run one of the course's demos on N ranks, as its notebook does: each rank's "
        "output live, tagged [rank N], then what each rank returned. A failure prints the "
        "verdict (which rank is the root cause, its traceback) and exits 1; the demos that "
        "hang on purpose stop after a few seconds with every rank's stack.",
        add_help=False)
    p.add_argument("-h", "--help", action=_RunHelp, help="show this help and every demo")
    p.add_argument("demo", help="the demo's name (see the list below)")
    p.add_argument("-n", "--world-size", type=int, default=4, help="number of ranks")
    p.add_argument("--backend", default="auto",
                   help="auto (gloo for CPU tensors, NCCL for CUDA ones where each rank has "
                        "a GPU), gloo or nccl")
    p.add_argument("--timeout", type=float, default=None,
                   help="seconds before the ranks are stopped (default: 60; 5 for the "
                        "demos that hang on purpose)")
    p.set_defaults(handler=_cmd_run)


class _RunHelp(argparse.Action):
    """``ddp-lab run --help`` lists every demo with its line; the list is built only when
    asked, so building the parser for other commands stays cheap."""

    def __init__(self, option_strings, dest, **kwargs):
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, **kwargs)

    def __call__(self, parser, namespace, values, option_string=None):
        from ddp_lab.tools.cli.demo_lines import describe
        from ddp_lab.tools.demos import DEMOS, HANGS_ON_PURPOSE
        parser.epilog = "demos:\n" + describe(DEMOS, HANGS_ON_PURPOSE)
        parser.print_help()
        parser.exit()


def _cmd_run(args: argparse.Namespace) -> int:
    import ddp_lab
    from ddp_lab.tools.demos import HANGS_ON_PURPOSE, default_timeout, load_demo
    timeout = default_timeout(args.demo) if args.timeout is None else args.timeout
    try:
        fn = load_demo(args.demo)
        res = ddp_lab.run(fn, world_size=args.world_size, backend=args.backend,
                          timeout=timeout)
    except (ValueError, TypeError, ddp_lab.DistributedRunError) as exc:
        print(f"ddp-lab run {args.demo}: {exc}", file=sys.stderr)
        if args.demo in HANGS_ON_PURPOSE and isinstance(exc, ddp_lab.WorkerTimeout):
            print(f"(expected: {args.demo!r} hangs on purpose; the stacks above show where "
                  "each rank waits)", file=sys.stderr)
        return 1
    for rank, value in enumerate(res.values):
        print(f"rank {rank} returned: {value!r}")
    print(f"{res.world_size} ranks, backend {res.backend}, {res.seconds:.2f} s")
    return 0


# --- notebooks -------------------------------------------------------------------------

def add_notebooks(sub) -> None:
    p = add_command(
        sub, "notebooks", "execute the course notebooks headless in a real kernel",
        "Execute the course's notebooks in order, each in a fresh Jupyter kernel, as CI "
        "and `make course` do. Shows which notebook and cell runs (in place on a terminal, "
        "a line now and then in a log), then writes BUILD/index.html: a card per notebook "
        "with what it teaches, its run time and your exercises, and keeps your progress in "
        "BUILD/progress.json (see `ddp-lab progress`). Exits 1 if a notebook fails.")
    p.add_argument("--dir", default="notebooks", type=Path, help="folder with the notebooks")
    p.add_argument("--build", default="build", type=Path,
                   help="where the executed copies, the HTML and your progress go")
    p.add_argument("--pattern", default="*.ipynb",
                   help="glob of the notebooks to run, e.g. '03*'")
    p.add_argument("--timeout", default=300.0, type=float, help="seconds allowed per cell")
    p.add_argument("--solved", action="store_true",
                   help="fill every exercise cell with its reference solution; fail if a "
                        "check still says 'not solved yet' (records no progress)")
    p.set_defaults(handler=_cmd_notebooks)


def _summary_table(reports) -> str:
    width = max(len("notebook"), *(len(r.name) for r in reports))
    lines = [f"{'notebook':<{width}}  status  seconds"]
    for r in reports:
        lines.append(f"{r.name:<{width}}  {'ok' if r.ok else 'FAILED':<6}  {r.seconds:7.1f}")
    return "\n".join(lines)


def _cmd_notebooks(args: argparse.Namespace) -> int:
    from ddp_lab.tools import notebook_runner

    if not notebook_runner.find_notebooks(args.dir, args.pattern):
        print(f"ddp-lab notebooks: no notebooks match {args.pattern!r} in {args.dir}/; "
              "pass --dir (and --pattern) to point at the course folder", file=sys.stderr)
        return 2
    from ddp_lab.tools.progress_live import LiveProgress

    with LiveProgress(sys.stdout) as live:
        reports = notebook_runner.run_all(args.dir, args.build, args.pattern, progress=live,
                                          timeout_per_cell=args.timeout, solved=args.solved)
    print("\n" + _summary_table(reports))
    print(f"\nreport: {(args.build / 'index.html').resolve()}", flush=True)
    failed = [r for r in reports if not r.ok]
    if failed:
        print(f"\n{len(failed)} of {len(reports)} notebooks failed:", file=sys.stderr)
    for r in failed:
        print(f"  {r.describe()}", file=sys.stderr)
    return 1 if failed else 0


# --- progress --------------------------------------------------------------------------

def add_progress(sub) -> None:
    p = add_command(
        sub, "progress", "which exercises you solved, and when, over your runs",
        "Print your progress through the course's exercises, as the runs of "
        "`ddp-lab notebooks` (and `make course`) recorded it in BUILD/progress.json: each "
        "exercise's latest check, when you first solved it, and what the check said about "
        "the ones not solved yet.")
    p.add_argument("--build", default="build", type=Path,
                   help="the build folder that `ddp-lab notebooks` wrote")
    p.set_defaults(handler=_cmd_progress)


def _cmd_progress(args: argparse.Namespace) -> int:
    import ddp_lab.exercises as ex
    from ddp_lab.tools import progress

    store = args.build / progress.STORE_NAME
    kept = progress.load(args.build)
    if not kept:
        print(f"ddp-lab progress: no progress recorded in {store} yet; run `make course` or "
              "`ddp-lab notebooks` first (and pass the same --build if you gave it one)",
              file=sys.stderr)
        return 1
    print(progress.table(kept, ex.names()))
    feedback = progress.feedback_lines(kept, ex.names())
    if feedback:
        print(f"\nWhat the latest checks said:\n{feedback}")
    return 0
