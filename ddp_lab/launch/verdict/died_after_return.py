"""A rank that died after its code had finished is told as what it is: a death in teardown.

The case that matters (torch 2.13, gloo; measured: 5 of 36 ``run_script(...,
launcher="torchrun")`` runs of finished scripts, 4 of 16 plain ``torchrun`` runs): the
script prints its last line and returns, and the process dies with SIGABRT, "terminate
called without an active exception", while Python shuts down. A process group was still
alive then, so gloo's worker threads were too; one of them dropped its last work, whose
saved thread-local state holds a Python object (ProcessGroupGloo.hpp, ``AsyncWork::tls_``),
and asked for the GIL to release it. A thread that asks for the GIL while the interpreter
finalizes is ended with ``pthread_exit`` (CPython's ``take_gil``), whose unwinding through
that ``noexcept`` destructor is ``std::terminate``. The group outlives
``destroy_process_group()`` when ``torch.distributed.nn`` is first imported after
``init_process_group`` (DDP's constructor imports it, through torch._dynamo): its functions'
default ``group=group.WORLD`` (torch/distributed/nn/functional.py) is evaluated then, and
holds the default group.

How the launcher knows the code had finished: ddp_lab's ranks leave a mark when it returns
(rank/main.py); a torchrun worker runs the script directly, and its fatal-signal report
(PYTHONFAULTHANDLER=1) lists no thread running Python: the main thread had left the script.
"""

from __future__ import annotations

import re

from ddp_lab.launch.errors import describe_exit
from ddp_lab.launch.rank.failure import RankFailure
from ddp_lab.launch.verdict.record import RankRecord, RunRecord
from ddp_lab.launch.verdict.stacks import no_python_running

GLOO_EXIT_ABORT = "terminate called without an active exception"
# the lines of a crash report: std::terminate's, then faulthandler's (threads, frames)
_REPORT = re.compile(r"terminate called|Fatal Python error|(Current thread|Thread) 0x|"
                     r"  <no Python frame>|  File \"|Extension modules: ")

GLOO_EXIT_ADVICE = (
    "Known cause (torch 2.13, gloo): a process group was still alive when Python shut "
    "down, and one of gloo's threads asked for the GIL then (to drop a Python object its "
    "last collective kept), which ends in std::terminate. It is torch's, not your code's: "
    "plain torchrun aborts the same way. Usually the group outlived "
    "destroy_process_group() because torch.distributed.nn was first imported after "
    "init_process_group (DDP's constructor does it), and its functions' default "
    "group=group.WORLD holds the default group. Fix it in the script: import "
    "torch.distributed.nn at its top, before init_process_group; and free the DDP model "
    "before destroy_process_group() (del ddp_model), or end with sys.stdout.flush(); "
    "os._exit(0) right after destroy_process_group(). ddp_lab's own launcher "
    "(run_script without launcher='torchrun') never runs a rank's interpreter exit.")
AFTER_RETURN_ADVICE = (
    "Its code had returned, so this happened while the process was being torn down "
    "(the process group destroyed, or the interpreter's exit): look at what the script "
    "leaves for that time (atexit handlers, threads, objects freed at exit).")


def finished(run: RunRecord, state: RankRecord, record: RankFailure | None) -> bool:
    """Whether ``state`` died (non-zero exit, no Python error of its own) after its code
    had returned."""
    if state.exitcode in (0, None) or record is not None or state.stopped_by_launcher:
        return False
    return run.marked_finished(state.rank) or (
        run.config.script is not None and no_python_running(state.log))


def values_so_far(run: RunRecord) -> list:
    """Each rank's value where it arrived (None elsewhere, or where unreadable)."""
    values = []
    for state in run.ranks:
        try:
            values.append(run.value(state.rank))
        except Exception:  # noqa: BLE001 - unpickling runs arbitrary code
            values.append(None)
    return values


def advice(run: RunRecord, state: RankRecord) -> str:
    """What it did before it died, what is kept, the known cause and the fix."""
    last = last_line(state.log)
    arrived = run.sent_value(state.rank)
    lines = [f"Its last output line: {last!r}." if last else "It printed nothing.",
             "Its value arrived: err.values[%d]; every value that arrived is in err.values."
             % state.rank if arrived else
             "It sent no value (return value or ddp_lab.report); the values that arrived "
             "are in err.values.",
             GLOO_EXIT_ADVICE if GLOO_EXIT_ABORT in state.log else AFTER_RETURN_ADVICE]
    return "\n".join(lines)


def reason(state: RankRecord) -> str:
    """One line for a rank that died the same way besides the root-cause rank."""
    return f"finished its work, then died on the way out ({describe_exit(state.exitcode)})"


def last_line(log: str) -> str:
    """The last line the rank printed itself, the crash report's lines left out: torchrun
    tees a worker's stdout and stderr separately, so its last printed line may come after
    the report in the log."""
    own = [line for line in log.splitlines() if line.strip() and not _REPORT.match(line)]
    return own[-1] if own else ""
