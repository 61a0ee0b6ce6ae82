"""One record of a finished run, whichever launcher ran it: how each rank ended, what it
printed, and where its result and error were left. ``outcome.conclude`` reads nothing else,
so the fork-server session and the torchrun session each build one and share the verdict.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from ddp_lab.launch.config import LaunchConfig, RunFiles
from ddp_lab.launch.rank.failure import RankFailure, read_failure


@dataclass(frozen=True)
class RankRecord:
    rank: int
    exitcode: int | None  # None: no exit was ever reported (the fork server died)
    exit_time: float | None  # monotonic; under torchrun, the rank's last sign of life
    stopped_by_launcher: bool  # killed because a peer failed, not for a reason of its own
    log: str  # everything it printed, one line per line


@dataclass(frozen=True)
class RunRecord:
    config: LaunchConfig
    ranks: tuple[RankRecord, ...]
    files: RunFiles  # results and error records, read only once the verdict needs them
    seconds: float
    timed_out: bool = False
    stacks: Mapping[int, str] = field(default_factory=dict)  # stuck rank -> its stack
    # rank -> its stack when the first rank timed out in a collective (verdict/timeouts.py)
    stacks_at_failure: Mapping[int, str] = field(default_factory=dict)
    took_part: tuple[int, ...] | None = None  # the ranks a live call went to (None: all)

    def participants(self) -> list[int]:
        return list(self.took_part) if self.took_part is not None else \
            [rank.rank for rank in self.ranks]

    def logs(self) -> list[str]:
        return [rank.log for rank in self.ranks]

    def failure(self, rank: int) -> RankFailure | None:
        """The failure record ``rank`` left; None when it left none."""
        return read_failure(self.files.error(rank))


def when_failed(state: RankRecord, failure: RankFailure | None) -> float | None:
    """When a rank failed: its record says, else its exit does (None: nothing says)."""
    if failure is not None and failure.time is not None:
        return failure.time
    return state.exit_time
