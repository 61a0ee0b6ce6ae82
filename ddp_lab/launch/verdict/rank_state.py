"""What the launcher knows about one rank while the run goes on: its process, how it ended,
and the lines it printed (``output.OutputReader`` splits them; ``output.kept_log.KeptLog`` keeps
their head and tail, bounded)."""

from __future__ import annotations

from dataclasses import dataclass, field

from ddp_lab.launch.config import LOG_LIMIT_BYTES, LaunchConfig
from ddp_lab.launch.output.kept_log import KeptLog
from ddp_lab.launch.verdict.record import RankRecord


@dataclass
class RankState:
    rank: int
    pid: int | None = None
    exitcode: int | None = None
    exit_time: float | None = None
    stopped_by_launcher: bool = False
    lines: KeptLog = field(default_factory=lambda: KeptLog(LOG_LIMIT_BYTES))

    @classmethod
    def of_run(cls, config: LaunchConfig) -> list[RankState]:
        """One per rank, each keeping as much of its output as ``config.log_limit`` says."""
        return [cls(rank, lines=KeptLog(config.log_limit)) for rank in range(config.world_size)]

    @property
    def running(self) -> bool:
        return self.pid is not None and self.exit_time is None

    def record(self) -> RankRecord:
        """How it ended, frozen for ``outcome.conclude``."""
        return RankRecord(self.rank, self.exitcode, self.exit_time, self.stopped_by_launcher,
                          self.lines.text())
