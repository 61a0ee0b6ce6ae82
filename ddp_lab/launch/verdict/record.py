"""One record of a finished run, whichever launcher ran it: how each rank ended, what it
printed, and its result and failure record (left in the run folder, or held in memory by the
session that has them: a live call's replies, torchrun's parsed logs). ``outcome.conclude``
reads nothing else, so every session builds one and they share the verdict.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from ddp_lab.launch.config import LaunchConfig, RunFiles, read_pickle
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
    files: RunFiles | None  # results and error records, read only once the verdict needs
    # them; None: a live call's, held in memory (``failures``, ``returned``)
    seconds: float
    timed_out: bool = False
    stacks: Mapping[int, str] = field(default_factory=dict)  # stuck rank -> its stack
    # rank -> its stack when the first rank timed out in a collective (verdict/timeouts.py)
    stacks_at_failure: Mapping[int, str] = field(default_factory=dict)
    took_part: tuple[int, ...] | None = None  # the ranks a live call went to (None: all)
    # rank -> its failure record, where the session holds them (None: read from ``files``)
    failures: Mapping[int, RankFailure] | None = None
    returned: frozenset[int] = frozenset()  # without files: the ranks whose code returned

    def participants(self) -> list[int]:
        return list(self.took_part) if self.took_part is not None else \
            [rank.rank for rank in self.ranks]

    def logs(self) -> list[str]:
        return [rank.log for rank in self.ranks]

    def failure(self, rank: int) -> RankFailure | None:
        """The failure record ``rank`` left; None when it left none."""
        if self.failures is not None:
            return self.failures.get(rank)
        return read_failure(self.files.error(rank))

    def sent_value(self, rank: int) -> bool:
        """Whether ``rank``'s code returned a value (or ``ddp_lab.report`` sent one)."""
        if self.files is None:
            return rank in self.returned
        return self.files.result(rank).exists()

    def value(self, rank: int):
        """``rank``'s value; None where none arrived, and for a failed live call (whose
        values are not kept). Unpickling runs arbitrary code: it may raise anything."""
        return None if self.files is None else read_pickle(self.files.result(rank))

    def marked_finished(self, rank: int) -> bool:
        """Whether ``rank`` left its mark that its code had returned (rank/main.py); a
        live call's ranks leave none (a live rank that dies has not returned)."""
        return self.files is not None and self.files.finished(rank).exists()


def when_failed(state: RankRecord, failure: RankFailure | None) -> float | None:
    """When a rank failed: its record says, else its exit does (None: nothing says)."""
    if failure is not None and failure.time is not None:
        return failure.time
    return state.exit_time
