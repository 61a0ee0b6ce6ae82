"""What a finished run amounts to: the ranks' values, or the error that explains it.

The root cause of a crash is the rank that failed first for a reason of its own; ranks whose
error is a broken connection (the usual way a peer's death shows up in gloo or NCCL), or
that the launcher stopped, are knock-on failures listed after it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ddp_lab.launch.errors import (DistributedRunError, UnreadableResult, WorkerError,
                                   WorkerTimeout, describe_exit, describe_ranks, safe_message,
                                   short_message)
from ddp_lab.launch.rank.failure import RankFailure
from ddp_lab.launch.verdict import died_after_return, everywhere, timeouts
from ddp_lab.launch.verdict.record import RankRecord, RunRecord, when_failed
from ddp_lab.launch.verdict.signs import looks_like_knock_on
from ddp_lab.launch.verdict.stacks import describe_crash


@dataclass(frozen=True)
class RunResult:
    """What ``ddp_lab.run`` returns: ``values[rank]``, ``logs[rank]``, ``seconds``."""

    values: list
    logs: list[str]
    seconds: float
    backend: str = "gloo"

    @property
    def world_size(self) -> int:
        return len(self.values)

    def __getitem__(self, rank: int):
        return self.values[rank]

    def __len__(self) -> int:
        return len(self.values)

    def __iter__(self):
        return iter(self.values)

    def __repr__(self) -> str:
        shown = repr(self.values)
        shown = shown if len(shown) <= 200 else shown[:197] + "..."
        return (f"RunResult(world_size={self.world_size}, backend={self.backend!r}, "
                f"seconds={self.seconds:.2f}, values={shown})")


def conclude(run: RunRecord) -> RunResult:
    """The values in rank order, or raise the error that explains why there are none."""
    __tracebackhide__ = True
    logs = run.logs()
    if run.timed_out:
        stuck = sorted(run.stacks)
        raise WorkerTimeout(run.config.timeout, stuck, dict(run.stacks), logs)
    failed = [s for s in run.ranks if s.exitcode != 0]
    if failed:
        raise _worker_error(run, failed, logs)
    return RunResult(_read_values(run, logs), logs, run.seconds, run.config.backend)


def _read_values(run: RunRecord, logs: list[str]) -> list:
    """Each rank's value. One this process cannot unpickle raises an error naming its rank,
    with every other rank's value still on it (``err.values``)."""
    values, reasons = [], {}
    for state in run.ranks:
        try:
            values.append(run.value(state.rank))
        except Exception as exc:  # noqa: BLE001 - unpickling runs arbitrary code
            values.append(None)
            reasons[state.rank] = f"{type(exc).__name__}: {short_message(safe_message(exc), 300)}"
    if reasons:
        raise UnreadableResult(reasons, values, logs)
    return values


def _worker_error(run: RunRecord, failed: list[RankRecord], logs) -> DistributedRunError:
    if any(s.exitcode is None for s in failed):
        return DistributedRunError("the ddp_lab fork server died during the run; every rank "
                                   "was stopped. Run again: a new one is started.")
    records = {s.rank: run.failure(s.rank) for s in failed}
    logs = [log + ("\n" + records[r].traceback if records.get(r) else "")
            for r, log in enumerate(logs)]
    took_part = run.participants()
    if same := everywhere.same_failure(failed, records, took_part):
        return _same_everywhere(run, same, records, logs)
    if absence := timeouts.never_joined(run, failed, records, took_part):
        return _never_joined(run, absence, failed, records, logs)
    done = {s.rank for s in failed if died_after_return.finished(run, s, records.get(s.rank))}
    failed_in_code = [s for s in failed if s.rank not in done and not s.stopped_by_launcher]
    root, hint = _blame(run, failed_in_code or [s for s in failed if s.rank in done] or
                        failed, records)
    if root.rank in done:
        hint = died_after_return.advice(run, root)
    others = [s for s in failed if s is not root]
    own = {s.rank for s in others if _failed_on_its_own(s, records.get(s.rank))}
    reasons = {s.rank: died_after_return.reason(s) if s.rank in done else
               _knock_on_reason(s, records.get(s.rank), root.rank) for s in others}
    knock_on = {r: why for r, why in reasons.items() if r not in own | done}
    also_failed = {r: why for r, why in reasons.items() if r in own | done}
    record = records.get(root.rank)
    trace = record.traceback if record else describe_crash(logs[root.rank])
    return WorkerError(root.rank, root.exitcode, "" if root.exitcode == 0 else trace, logs,
                       knock_on, hint=hint, also_failed=also_failed,
                       values=died_after_return.values_so_far(run), finished=root.rank in done)


def _same_everywhere(run: RunRecord, same: list[int], records, logs) -> WorkerError:
    """One failure, told once: no root cause, no list of copies (verdict/everywhere.py)."""
    first = next(s for s in run.ranks if s.rank == same[0])
    record = records[first.rank]
    return WorkerError(first.rank, first.exitcode, record.traceback, logs,
                       hint=_double_init_hint(record), same_on=same,
                       values=died_after_return.values_so_far(run),
                       headline=everywhere.headline(same, len(run.ranks), record,
                                                    describe_exit(first.exitcode)))


def _never_joined(run: RunRecord, absence, failed, records, logs) -> WorkerError:
    """Ranks timed out in a collective that ``absence.cause`` never joined: it is the root
    cause, they are its victims (verdict/timeouts.py)."""
    cause = absence.cause
    others = [s for s in failed if s.rank not in absence.victims and s is not cause]
    reasons = {s.rank: _knock_on_reason(s, records.get(s.rank), cause.rank) for s in others}
    own = {s.rank for s in others if _failed_on_its_own(s, records.get(s.rank))}
    return WorkerError(cause.rank, cause.exitcode, absence.evidence, logs,
                       {r: why for r, why in reasons.items() if r not in own},
                       hint=timeouts.advice(absence),
                       also_failed={r: why for r, why in reasons.items() if r in own},
                       values=died_after_return.values_so_far(run), victims=absence.victims,
                       headline=absence.headline())


def _blame(run: RunRecord, failed: list[RankRecord], records) -> tuple[RankRecord, str]:
    """The root-cause rank and a hint. When every failure is a broken connection and some
    rank ended cleanly, that rank left its peers waiting: it is the root cause."""
    root = _root_cause(failed, records)
    leaver = _early_leaver(run) if looks_like_knock_on(records.get(root.rank)) else None
    if leaver is None:
        return root, _double_init_hint(records.get(root.rank))
    return leaver, _early_exit_hint(run, leaver, records[root.rank])


def _failed_on_its_own(state: RankRecord, record) -> bool:
    """An error of its own (not a broken connection, not stopped by us)."""
    return not state.stopped_by_launcher and record is not None and \
        not looks_like_knock_on(record)


def _early_leaver(run: RunRecord) -> RankRecord | None:
    """The rank that ended cleanly first, preferring one that left fn without a value
    (``os._exit(0)`` or ``sys.exit(0)`` inside fn write no result file)."""
    finished = [s for s in run.ranks if s.exitcode == 0]
    silent = [s for s in finished if _left_fn_early(run, s)]
    return min(silent or finished, key=lambda s: s.exit_time or 0.0, default=None)


def _left_fn_early(run: RunRecord, state: RankRecord) -> bool:
    return run.config.script is None and not run.sent_value(state.rank)


def _early_exit_hint(run: RunRecord, leaver: RankRecord, knock_on: RankFailure) -> str:
    """Gloo turns 'a peer left while we wait for it' into a connection error: say who left
    and why that breaks the others."""
    who = f"Rank {leaver.rank}"
    if "connectfullmesh" in knock_on.message.lower():
        return (f"{who} returned while the others were still connecting to it in "
                "init_process_group: no rank may leave before every rank has set the group "
                "up. ddp_lab makes init_process_group wait for all ranks "
                "(TORCH_DIST_INIT_BARRIER=1) unless env= turns that off.")
    if _left_fn_early(run, leaver):
        return (f"{who} ended before fn returned, without a value (os._exit() or sys.exit() "
                "inside fn stop a rank at once), while the others still waited for it in a "
                "collective: return from fn instead, after the same collectives as every "
                "other rank.")
    finished = [s.rank for s in run.ranks if s.exitcode == 0]
    return (f"{describe_ranks(finished).capitalize()} returned while the others still waited in a "
            "collective: the ranks did not call the same collectives the same number of "
            "times (uneven data per rank is the usual cause; see notebook 08 and "
            "torch.distributed.algorithms.Join).")


def _double_init_hint(record: RankFailure | None) -> str:
    """fn initialized the group that ddp_lab.run had already initialized: it was written for
    torch.multiprocessing.spawn (or torchrun), where the function sets up its own group."""
    if not record or "default process group twice" not in record.message:
        return ""
    return ("fn calls init_process_group itself, but ddp_lab.run has already initialized "
            "the default group for it. Either drop that call (and the MASTER_ADDR/"
            "MASTER_PORT lines) from fn, or keep fn unchanged: a function written for "
            "torch.multiprocessing.spawn, fn(rank, ...), runs with ddp_lab.spawn(fn, "
            "args=(world_size,), nprocs=world_size); a torchrun script runs with "
            "ddp_lab.run_script(path, world_size=N).")


def _root_cause(failed, records):
    def failed_at(state):
        when = when_failed(state, records.get(state.rank))
        return math.inf if when is None else when

    own = [s for s in failed if not s.stopped_by_launcher]
    primary = [s for s in own if not looks_like_knock_on(records.get(s.rank))]
    return min(primary or own or failed, key=failed_at)


def _knock_on_reason(state: RankRecord, record, root_rank: int) -> str:
    if state.stopped_by_launcher:
        return f"stopped by the launcher after rank {root_rank} brought the run down"
    if record:
        return record.one_line
    return describe_exit(state.exitcode)
