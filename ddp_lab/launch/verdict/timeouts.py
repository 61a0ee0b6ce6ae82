"""A collective that timed out names the rank that was not in it, not the first to give up.

When ranks time out in a collective (gloo: "Timed out waiting 1000ms for recv operation",
a store: "wait timeout after 1000ms", NCCL's watchdog: "collective operation timeout"), the
ranks that raise are the **victims**: they waited. The cause is the rank that never joined
that collective: a straggler still in its own code, a rank waiting in another collective,
or a rank that had died. The first rank to time out only gave up first, by microseconds.

What tells them apart, all from what the launcher collected: each failed rank's error
record (type, message, traceback, when), how each rank ended (exit code, exit time), and,
where the run had it, each rank's stack taken the moment the first rank timed out
(session.py collects them then: ``RunRecord.stacks_at_failure``).
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from ddp_lab.launch.errors import describe_exit, describe_ranks
from ddp_lab.launch.rank.failure import RankFailure, read_failure
from ddp_lab.launch.verdict.record import RankRecord, RunRecord, when_failed
from ddp_lab.launch.verdict.signs import is_timeout, looks_like_knock_on
from ddp_lab.launch.verdict.stacks import NO_STACK, is_launcher_file, waiting_in

_FRAME = re.compile(r'File "(?P<file>[^"]*)", line (?P<line>\d+), in (?P<func>\S+)'
                    r'(?:\n\s{4}(?P<source>\S.*))?')


def stacks_at_timeout(files, ranks, collect) -> dict[int, str] | None:
    """Once some rank's error is a timeout: the stacks (``collect(ranks)``) of the ranks
    still running without an error of their own, which say who never joined the collective;
    None until then (the session asks again on its next turn: a knock-on failure may come
    first, from a victim that closed its connections before it had written its error)."""
    errors = [read_failure(files.error(state.rank)) for state in ranks]
    if not any(is_timeout(error) for error in errors):
        return None
    return collect([s.rank for s, error in zip(ranks, errors) if s.running and error is None])


@dataclass(frozen=True)
class Absence:
    """The verdict on a timed-out collective: who waited, who never came, where it was."""

    cause: RankRecord  # the first rank that never joined (err.rank)
    absent: list[int]  # every rank that never joined
    victims: dict[int, str]  # rank -> its timeout error, one line
    collective: str  # what the victims waited in: "all_reduce", "new_group", ...
    whereabouts: str  # where the cause was: "it was in time.sleep ..."
    evidence: str  # its stack at the time, or its own traceback
    later: str  # what became of it after they gave up ("" when nothing more)

    def headline(self) -> str:
        return (f"{_ranks(self.absent)} never joined the {self.collective} that "
                f"{_ranks(sorted(self.victims))} waited in; they timed out (victims). "
                f"{_capitalized(self.whereabouts)}: rank {self.cause.rank} is the root cause.")


def never_joined(run: RunRecord, failed: list[RankRecord], records: dict,
                 took_part: list[int]) -> Absence | None:
    """The verdict when some ranks timed out waiting in one collective and others were not
    in it; None when no rank timed out, or every rank waited in the same place."""
    timed_out = [s for s in failed if is_timeout(records.get(s.rank))]
    if not timed_out:
        return None
    places = {s.rank: _place(records[s.rank].traceback) for s in timed_out}
    place, _ = Counter(places.values()).most_common(1)[0]
    waited = [r for r in took_part if places.get(r) == place or
              _was_there(run.stacks_at_failure, r, records.get(r), place)]
    gave_up = min(when_failed(s, records[s.rank]) for s in timed_out if places[s.rank] == place)
    by_rank = {s.rank: s for s in run.ranks}
    absent = [r for r in took_part if r not in waited and
              _seen_elsewhere(run, by_rank[r], records.get(r), gave_up)]
    if not absent:  # no rank is known to have been elsewhere: the plain verdict stands
        return None
    victims = [s for s in failed if s.rank in waited]
    cause = by_rank[absent[0]]
    whereabouts, evidence, later = _where(run, cause, records.get(cause.rank), gave_up)
    return Absence(cause, absent, {v.rank: records[v.rank].one_line if records.get(v.rank)
                                   else "its process ended" for v in victims},
                   place[0], whereabouts, evidence, later)


def _was_there(stacks: dict, rank: int, record: RankFailure | None, place) -> bool:
    """Whether a rank that did not time out itself waited in the same place too: its stack
    when the first rank timed out says so; a rank that had left by then broke off there
    with a knock-on error (a victim that gave up first closed its connections)."""
    if _in_user_code(stacks.get(rank, NO_STACK)):
        return _place(stacks[rank]) == place
    return looks_like_knock_on(record) and _place(record.traceback) == place


def _seen_elsewhere(run: RunRecord, rank: RankRecord, record: RankFailure | None,
                    gave_up: float) -> bool:
    """Whether anything says where a rank that did not wait with the victims was: its
    stack, its own error, or an end before they gave up. A rank killed by the launcher
    with neither (torchrun's agent stops the others at once) is not blamed on no evidence."""
    ended_first = (rank.exit_time or gave_up) < gave_up
    return (_in_user_code(run.stacks_at_failure.get(rank.rank, NO_STACK))
            or record is not None or ended_first)


def _place(traceback: str) -> tuple[str, tuple | None]:
    """(the collective, the innermost frame outside torch) a traceback waited at."""
    frames = list(_FRAME.finditer(traceback))
    own = [f for f in frames if not re.search(r"[/\\]torch[/\\]", f["file"])]
    where = (own[-1]["file"], own[-1]["line"]) if own else None
    return collective_name(traceback), where


def collective_name(text: str) -> str:
    """The torch.distributed call a traceback or stack waits in; DDP's gradient all-reduce
    shows as a backward() with no torch.distributed frame (it runs from C++ hooks)."""
    name = waiting_in(text)
    if name and " " not in name:
        return name
    if re.search(r"in (backward|_engine_run_backward|run_backward)\b", text):
        return "gradient all_reduce of DDP's backward()"
    return "collective"


def _where(run: RunRecord, rank: RankRecord, record: RankFailure | None,
           gave_up: float) -> tuple[str, str, str]:
    """(where the absent rank was when the victims gave up, the evidence, what came later)."""
    ended = when_failed(rank, record) or gave_up
    stack = run.stacks_at_failure.get(rank.rank, NO_STACK)
    if rank.exitcode == 0 and ended < gave_up:
        return "it had already returned, before they gave up", "", ""
    if is_timeout(record):  # it timed out too, somewhere else
        return (f"it was in {collective_name(record.traceback)} (another collective) "
                "instead", record.traceback, "")
    if _in_user_code(stack):
        return _in_stack(stack), stack, _later(rank, record)
    if looks_like_knock_on(record):
        return (f"it reached {collective_name(record.traceback)} only after they had "
                "given up", record.traceback, _later(rank, record))
    if rank.exitcode not in (0, None) and ended < gave_up:
        why = f": {record.one_line}" if record else ""
        return (f"it had died ({describe_exit(rank.exitcode)}{why}) before they gave up",
                record.traceback if record else "", "")
    if record:
        return ("it was not in a collective: it failed later, of its own",
                record.traceback, "")
    return "no stack of it was taken", "", _later(rank, record)


def _in_user_code(stack: str) -> bool:
    """A stack that shows where the rank's own code was: not the placeholder of a rank that
    did not answer, nor one taken while the launcher wrote the rank's error on its way out."""
    frames = list(_FRAME.finditer(stack))
    return stack != NO_STACK and not (frames and is_launcher_file(frames[-1]["file"]))


def _in_stack(stack: str) -> str:
    """'it was in barrier (another collective)' or 'it was running its own code, at ...'."""
    name = waiting_in(stack)
    if name and " " not in name:
        return f"it was in {name} (another collective) when they gave up"
    frames = list(_FRAME.finditer(stack))
    if not frames:
        return "it was running (no Python frame in its stack) when they gave up"
    last = frames[-1]
    code = (last["source"] or "").split("  #")[0].strip()
    return (f"it was still in its own code when they gave up ({last['func']}, "
            f"{Path(last['file']).name} line {last['line']}" + (f": {code})" if code else ")"))


def _later(rank: RankRecord, record: RankFailure | None) -> str:
    if record is not None:
        line = record.one_line
        return f"Rank {rank.rank} failed only after they had gone: {line}" + \
            ("" if line.endswith(".") else ".")
    if rank.stopped_by_launcher:
        return f"Rank {rank.rank} was stopped by the launcher after they had gone."
    return ""


def advice(absence: Absence) -> str:
    """The hint: its later fate, then what to do about a late rank."""
    return "\n\n".join(filter(None, [absence.later, (
        "A collective waits for every rank of its group, up to the process group's timeout: "
        f"find why rank {absence.cause.rank} was not there in time (slow work of its own, "
        "another collective, uneven data, a crash), or give init_process_group a timeout "
        "larger than the skew the job legitimately has.")]))


def _ranks(ranks: list[int]) -> str:
    """'rank 2', 'ranks 0, 1, 3' (a range only from four ranks on: 'ranks 0-5')."""
    return describe_ranks(ranks) if len(ranks) > 3 else \
        ("rank " if len(ranks) == 1 else "ranks ") + ", ".join(map(str, ranks))


def _capitalized(text: str) -> str:
    return text[:1].upper() + text[1:]
