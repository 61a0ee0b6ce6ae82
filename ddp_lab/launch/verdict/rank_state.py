"""What the launcher knows about one rank while the run goes on: its process, how it ended,
and the lines it printed (``output.OutputReader`` splits them)."""

from __future__ import annotations

from dataclasses import dataclass, field

from ddp_lab.launch.verdict.record import RankRecord


@dataclass
class RankState:
    rank: int
    pid: int | None = None
    exitcode: int | None = None
    exit_time: float | None = None
    stopped_by_launcher: bool = False
    lines: list = field(default_factory=list)

    @property
    def running(self) -> bool:
        return self.pid is not None and self.exit_time is None

    def record(self) -> RankRecord:
        """How it ended, frozen for ``outcome.conclude``."""
        return RankRecord(self.rank, self.exitcode, self.exit_time, self.stopped_by_launcher,
                          "\n".join(self.lines))
