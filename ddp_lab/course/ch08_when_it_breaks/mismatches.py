"""Notebook 08, part 3: ranks that call *different* collectives, and the tools that say so.

Collectives match up by order: the k-th collective of rank 0 meets the k-th of rank 1,
whatever they are. A mismatch (another op, shape, dtype or ReduceOp) may hang, crash the
process, or silently compute garbage. ``TORCH_DISTRIBUTED_DEBUG=DETAIL`` makes every
collective first compare a fingerprint across the ranks (op, shapes, dtypes), and
``monitored_barrier`` names the ranks that never arrive.
"""

from __future__ import annotations

import time
from datetime import timedelta

import torch
import torch.distributed as dist

MISMATCHES = ("shape", "op", "dtype", "reduce op")
DETAIL = {"TORCH_DISTRIBUTED_DEBUG": "DETAIL"}
WHAT_WAS_MEANT = {"reduce op": " (SUM would be [10, 12, 14, 16], MAX [10, 11, 12, 13])"}


def mismatched(case: str) -> list[float]:
    """Rank 0 and rank 1 disagree about one collective, then run two good ones (as a
    training loop would go on)."""
    rank = dist.get_rank()
    t = torch.arange(4.0) + 10 * rank  # rank 0: 0 1 2 3, rank 1: 10 11 12 13
    if case == "shape":
        dist.all_reduce(t[:4 - rank].clone())  # 4 elements on rank 0, 3 on rank 1
    elif case == "op":
        dist.all_reduce(t) if rank == 0 else dist.broadcast(t, src=0)
    elif case == "dtype":
        dist.all_reduce(t if rank == 0 else t.double())
    elif case == "reduce op":
        dist.all_reduce(t, op=dist.ReduceOp.SUM if rank == 0 else dist.ReduceOp.MAX)
    result = t.tolist()
    for _ in range(2):
        dist.all_reduce(torch.ones(1))
    return result


def try_mismatch(case: str, env: dict | None = None, timeout: float = 2.0) -> tuple[str, str]:
    """(outcome, the line that says what happened) for one case on 2 ranks."""
    import ddp_lab
    try:
        res = ddp_lab.run(mismatched, 2, args=(case,), timeout=timeout, env=env, echo=False)
    except ddp_lab.WorkerTimeout as err:
        lines = {r: _call_line(s) for r, s in sorted(err.stacks.items())}
        return "hang", "; ".join(f"rank {r} waits in {line}" for r, line in lines.items())
    except ddp_lab.WorkerError as err:
        crashed = (err.exitcode or 0) < 0
        return ("crash" if crashed else "error"), error_line(err)
    agree = "both ranks got" if res.values[0] == res.values[1] else "the ranks got"
    return "no error", f"{agree} {res.values[0]}{WHAT_WAS_MEANT.get(case, '')}"


def compare_debug_levels(timeout: float = 2.0) -> dict[str, dict[str, tuple[str, str]]]:
    """Every case with the default debug level and under DETAIL."""
    return {case: {"default": try_mismatch(case, None, timeout),
                   "DETAIL": try_mismatch(case, DETAIL, timeout)} for case in MISMATCHES}


def _call_line(stack: str) -> str:
    """The innermost line of the user's code in a formatted stack (notebook or module)."""
    lines = [ln.strip() for ln in stack.splitlines() if ln.startswith("    ") and
             not ln.startswith("      ")]
    code = [ln for ln in lines if "dist." in ln]
    line = code[-1] if code else (lines[-1] if lines else "?")
    return line.split("  #")[0]


def error_line(err) -> str:
    """What went wrong, in one line: DETAIL's verdict, gloo's abort message, or the error."""
    text = err.logs[err.rank] + "\n" + err.traceback
    if "differ in the following aspects:" in text:
        verdict = text.split("differ in the following aspects:")[1].splitlines()[0]
        return "Detected mismatch between collectives: " + " ".join(verdict.split())
    aborts = [ln.split("what():")[-1].strip() for ln in text.splitlines() if "what():" in ln]
    if aborts:
        return aborts[-1]
    errors = [ln for ln in err.traceback.splitlines() if "Error" in ln]
    return errors[-1] if errors else err.traceback.strip().splitlines()[-1]


def ddp_under_torchrun(level: str = "DETAIL", nproc: int = 2):
    """``ddp_construct.py`` under plain torchrun (no ddp_lab launcher in between) with
    ``TORCH_DISTRIBUTED_DEBUG=level``: the ``TorchrunResult`` (torch 2.13 on CPU: every
    rank dies with SIGSEGV in DDP's constructor under DETAIL, and runs under INFO)."""
    import tempfile

    from ddp_lab.launch.torchrun.command import torchrun
    from ddp_lab.scripts import script_path
    with tempfile.TemporaryDirectory(prefix="ddp_lab-torchrun-") as log_dir:
        return torchrun([script_path("ddp_construct.py")], nproc, log_dir=log_dir,
                        env={"TORCH_DISTRIBUTED_DEBUG": level})


def stuck_ranks_at_barrier(stuck=(1, 3), stuck_s: float = 2.5, wait_s: float = 1.0) -> str:
    """Ranks in ``stuck`` are busy elsewhere for ``stuck_s``; the others call
    ``monitored_barrier``, whose rank 0 names every rank that did not arrive in ``wait_s``.
    Returns this rank's outcome (the error text where there is one)."""
    # torch refuses monitored_barrier unless dist.get_backend(group) is "gloo": under NCCL,
    # or "cpu:gloo,cuda:nccl" (backend="auto" with a GPU per rank), every rank first makes
    # a gloo group for it
    group = None if dist.get_backend() == "gloo" else dist.new_group(backend="gloo")
    if dist.get_rank() in stuck:
        time.sleep(stuck_s)  # stuck in data loading, a deadlock, an infinite loop...
        return "was busy elsewhere"
    try:
        dist.monitored_barrier(group, timeout=timedelta(seconds=wait_s), wait_all_ranks=True)
        return "passed"
    except RuntimeError as exc:
        return str(exc).split("\n Original exception")[0]
