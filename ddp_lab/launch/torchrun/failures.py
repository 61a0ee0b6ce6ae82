"""What torchrun's agent says of each worker that failed: a typed record, written as JSON by
the agent (``agent.py``, from torch's ``ChildFailedError``) and read by the session.

These are other facts than a rank's own failure record (rank/failure.py): the exit code the
agent saw, the worker's pid and local rank, torch's one-line message. The rank's exception
(type, message, traceback) is read from its log instead (``tee.last_failure``), since a
worker under torchrun writes no record of its own.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path

from ddp_lab.launch.errors import DistributedRunError, short_message


@dataclass(frozen=True)
class AgentFailure:
    """One failed worker as torchrun's agent reported it (``ProcessFailure``'s fields)."""

    exitcode: int  # negative: killed by that signal
    local_rank: int | None = None
    pid: int | None = None
    message: str = ""
    error_file: str = ""

    @classmethod
    def of(cls, failure) -> AgentFailure:
        """From torch's ``torch.distributed.elastic.multiprocessing.errors.ProcessFailure``."""
        return cls(failure.exitcode, failure.local_rank, failure.pid, str(failure.message),
                   str(failure.error_file))

    def to_plain(self) -> dict:
        return asdict(self)

    @classmethod
    def from_plain(cls, data) -> AgentFailure:
        """The record ``to_plain`` gave; ValueError saying what is wrong with anything else."""
        if not isinstance(data, dict) or not _is_int(data.get("exitcode")):
            raise ValueError(f"no integer exit code in {short_message(repr(data))}")
        return cls(data["exitcode"], _int_or_none(data.get("local_rank")),
                   _int_or_none(data.get("pid")), str(data.get("message") or ""),
                   str(data.get("error_file") or ""))


def write_agent_failures(path: Path, failures: dict[int, AgentFailure]) -> None:
    """Global rank -> failure, as JSON; written aside, then renamed over."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps({str(rank): f.to_plain() for rank, f in failures.items()}))
    os.replace(tmp, path)


def read_agent_failures(path: Path) -> dict[int, AgentFailure]:
    """Global rank -> what the agent reported; {} when it reported no failure. A report that
    cannot be read leaves no verdict to give: say so, naming the file."""
    try:
        text = path.read_text(errors="replace")
    except FileNotFoundError:
        return {}
    try:
        return {int(rank): AgentFailure.from_plain(entry)
                for rank, entry in json.loads(text).items()}
    except (ValueError, AttributeError) as exc:  # not JSON, not an object, a bad entry
        raise DistributedRunError(
            f"torchrun's report of its failed workers ({path}) could not be read "
            f"({short_message(str(exc))}); each rank's output is in its log. This is a "
            "bug of ddp_lab's torchrun agent: please report it.") from None


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _int_or_none(value) -> int | None:
    return value if _is_int(value) else None
