"""What the launcher knows about one rank: its process, how it ended, and its output.

Output arrives as arbitrary chunks of bytes; ``feed`` turns them into whole lines (never
half a line, so two ranks can't share one) and notices progress bars, which redraw the
current line with ``\\r`` instead of ending it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ddp_lab.launch.echo import visible_text


@dataclass
class RankState:
    rank: int
    pid: int | None = None
    exitcode: int | None = None
    exit_time: float | None = None
    stopped_by_launcher: bool = False
    lines: list = field(default_factory=list)
    partial: bytes = b""

    @property
    def running(self) -> bool:
        return self.pid is not None and self.exit_time is None

    def feed(self, chunk: bytes) -> tuple[list[str], str | None]:
        """New complete lines (also kept in ``lines``), and the progress text if the
        unfinished line is a bar being redrawn."""
        *complete, self.partial = (self.partial + chunk).split(b"\n")
        lines = [visible_text(raw) for raw in complete]
        self.lines.extend(lines)
        if b"\r" not in self.partial:
            return lines, None
        self.partial = self.partial[self.partial.rfind(b"\r"):]  # older redraws are gone
        return lines, visible_text(self.partial)
