"""A failure that is the same on every rank is one failure, told once, with no root cause.

A typo in a ``%%ranks`` cell, ``ranks.pull("does_not_exist")``, a function that uses a name
the ranks do not have: every rank raises the same error at the same line. Naming one of
them "the root cause" (whichever raised first, by a few microseconds) and listing the
others as "failed on their own" is four copies of one traceback and a false lead. A root
cause is named only where ranks differ.

"The same" is: the same exception type, raised at the same line, with the same message
once the rank's own number is left out ("not defined on rank 2" is the same message on
rank 0 as "not defined on rank 0").
"""

from __future__ import annotations

import re

from ddp_lab.launch.rank.failure import RankFailure
from ddp_lab.launch.verdict.record import RankRecord

_LAST_FRAME = re.compile(r'File "([^"]*)", line (\d+)')


def same_failure(failed: list[RankRecord], records: dict, took_part: list[int]) -> list[int]:
    """The ranks, when every rank that took part (``took_part``) raised the same error of
    its own; else []. Two ranks at least: one failing rank is a root cause already."""
    if len(took_part) < 2 or sorted(s.rank for s in failed) != sorted(took_part):
        return []
    if any(s.stopped_by_launcher or records.get(s.rank) is None for s in failed):
        return []
    signatures = {signature(records[s.rank], s.rank) for s in failed}
    return sorted(took_part) if len(signatures) == 1 else []


def signature(record: RankFailure, rank: int) -> tuple[str, str, tuple | None]:
    """What two ranks' errors must share to be one failure: the type, the message with the
    rank's own number left out, and the innermost frame of the traceback."""
    message = re.sub(rf"\brank {rank}\b", "rank <r>", record.message)
    frames = _LAST_FRAME.findall(record.traceback)
    return record.type_name, message, frames[-1] if frames else None


def headline(ranks: list[int], world_size: int, record: RankFailure, exit_text: str) -> str:
    """'every rank failed the same way (exit code 1), so no rank is the root cause: ...'."""
    who = "every rank" if len(ranks) == world_size else f"every rank it ran on ({_list(ranks)})"
    return (f"{who} failed the same way ({exit_text}), so no rank is the root cause: the same "
            f"{record.type_name} on each. Rank {ranks[0]}'s traceback (each rank's is in "
            "err.logs[rank]):")


def _list(ranks: list[int]) -> str:
    from ddp_lab.launch.errors import describe_ranks
    return describe_ranks(ranks)
