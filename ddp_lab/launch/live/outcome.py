"""What a live call amounts to: the values of the ranks it went to, or the error a one-shot
run would raise for the same failure, with what became of the ranks said on it.

A failed call is recorded as a one-shot run is (a ``RunRecord``, holding each rank's
failure record in memory) and judged by ``outcome.conclude``: one home for root causes,
knock-on failures and hang reports.
"""

from __future__ import annotations

import pickle
import time
from dataclasses import replace

from ddp_lab.launch.errors import (DistributedRunError, UnreadableResult, describe_exit,
                                   describe_ranks, safe_message)
from ddp_lab.launch.rank.failure import RankFailure
from ddp_lab.launch.verdict.outcome import RunResult, conclude
from ddp_lab.launch.verdict.record import RankRecord, RunRecord

KILLED = -9  # what a rank that could not be interrupted will have been: killed
# A process-group operation that gave up waiting (gloo: "Timed out waiting 2000ms for recv
# operation to complete", a monitored barrier's "Rank 3 failed to pass monitoredBarrier in
# 2000 ms", then "Application timeout caused pair closure" on the closed pair; NCCL's
# watchdog: "collective operation timeout"). gloo closes the connection of an operation that
# timed out, so the group fails its next collective on that rank while the others wait in it:
# the session restarts the ranks now, not one call later. A store's own wait timeout ("wait
# timeout after") leaves the group intact and is not one of these.
GROUP_TIMEOUT_SIGNS = ("timed out waiting", "failed to pass monitoredbarrier",
                       "timed out in monitoredbarrier", "application timeout caused pair closure",
                       "collective operation timeout")


def verdict(session, call) -> RunResult:
    """The call's RunResult (values and logs of the ranks it went to, in that order), or
    raise its error with ``err.session`` set to "kept", "restart" or "stopped"."""
    __tracebackhide__ = True
    if call.died or call.stuck or any(r.status != "ok" for r in call.replies.values()):
        raise _failure(call_record(session, call), call)
    logs = session.logs()
    values = _values(call, [logs[r] for r in call.targets])
    return RunResult(values, [logs[r] for r in call.targets], time.monotonic() - call.started,
                     session.config.backend)


def _values(call, logs: list[str]) -> list:
    values, reasons = [], {}
    for rank in call.targets:
        try:
            values.append(pickle.loads(call.replies[rank].body))
        except Exception as exc:  # noqa: BLE001 - unpickling runs arbitrary code
            values.append(None)
            reasons[rank] = f"{type(exc).__name__}: {safe_message(exc)}"
    if reasons:
        raise UnreadableResult(reasons, values, logs)
    return values


def call_record(session, call) -> RunRecord:
    """The call as a one-shot run's record (``session.record()``): each rank's ending, and
    the failure records and values held in memory (``files`` None)."""
    logs = session.logs()
    judged = [_rank_record(session, call, state, logs[state.rank]) for state in session.ranks]
    raised = any(reply.status == "error" for reply in call.replies.values())
    timed_out = bool(call.stuck) and not raised and not call.died
    return RunRecord(replace(session.config, timeout=call.timeout),
                     tuple(rank for rank, _ in judged), None, time.monotonic() - call.started,
                     timed_out, dict(call.stacks), took_part=tuple(call.targets),
                     failures={rank.rank: failure for rank, failure in judged if failure},
                     returned=frozenset(state.rank for state in session.ranks
                                        if _alive(call, state) and _replied_ok(call, state)))


def _failure(record: RunRecord, call) -> DistributedRunError:
    try:
        conclude(record)
    except DistributedRunError as exc:
        return _with_session_state(exc, call)
    return DistributedRunError("the call failed, but no rank says why")  # never reached


def _rank_record(session, call, state, log: str) -> tuple[RankRecord, RankFailure | None]:
    """How the rank ended this call, and its failure record if it has one: in memory, for
    ``conclude`` (a live call's records never touch the disk)."""
    rank, reply = state.rank, call.replies.get(state.rank)
    if not _alive(call, state):  # its failure, if any, is in its file: e.g. the group's set-up
        return (RankRecord(rank, state.exitcode, state.exit_time, state.stopped_by_launcher, log),
                session.dead_rank_failure(rank))
    if reply is None and rank in call.targets:  # stuck, not interruptible: to be killed
        return RankRecord(rank, KILLED, time.monotonic(), True, log), None
    if _replied_ok(call, state):
        return RankRecord(rank, 0, time.monotonic(), False, log), None
    failure = RankFailure.from_plain(reply.body)
    interrupted = reply.status == "interrupted"  # by the launcher, after a peer's failure
    return RankRecord(rank, 1, failure.time or time.monotonic(), interrupted, log), failure


def _alive(call, state) -> bool:
    return state.rank not in call.died and state.exitcode is None


def _replied_ok(call, state) -> bool:
    """It answered the call, or had nothing to answer (not one of its targets)."""
    reply = call.replies.get(state.rank)
    return reply.status == "ok" if reply is not None else state.rank not in call.targets


def _with_session_state(exc: DistributedRunError, call) -> DistributedRunError:
    exc.session, note = session_state(call)
    message = str(exc)
    reply = call.replies.get(getattr(exc, "rank", None))
    if reply is not None and reply.status == "error":  # it raised; its process lives on
        message = message.replace(f"failed the same way ({describe_exit(1)})",
                                  "raised the same exception", 1)
        message = message.replace(f"failed ({describe_exit(1)})", "raised an exception", 1)
    exc.args = (f"{message}\n\n{note}",)
    return exc


def session_state(call) -> tuple[str, str]:
    """What became of the live ranks, and the sentence that says so."""
    if call.died:
        return "stopped", (f"The live ranks are stopped: {describe_ranks(call.died)} died, "
                           "which breaks the process group of all. ranks.restart() starts "
                           "new ones.")
    if call.pending:
        return "restart", (f"{_were(call.pending, 'could')} not be interrupted (waiting inside a "
                           "collective): the ranks were restarted with a new process group "
                           "and empty namespaces.")
    timed_out = group_timed_out(call)
    if timed_out:
        return "restart", (f"{_were(timed_out, 'timed')} out in an operation of the process "
                           "group, and gloo closes the connections of an operation that timed "
                           "out: the group is of no further use, so the ranks were restarted "
                           "with a new process group and empty namespaces.")
    if call.stuck:
        return "kept", (f"{_were(call.stuck)} interrupted where they waited; every rank is "
                        "idle again and keeps its namespace.")
    return "kept", "Every rank answered: the ranks keep their namespaces."


def group_timed_out(call) -> list[int]:
    """The ranks whose error says an operation of their process group timed out."""
    return [rank for rank, reply in sorted(call.replies.items())
            if reply.status == "error" and any(
                sign in RankFailure.from_plain(reply.body).message.lower()
                for sign in GROUP_TIMEOUT_SIGNS)]


def _were(ranks: list[int], verb: str = "") -> str:
    """'Rank 1 was' / 'Ranks 0-2 were' (or 'Rank 1 could' with a verb of its own)."""
    return f"{describe_ranks(ranks).capitalize()} {verb or ('was' if len(ranks) == 1 else 'were')}"
