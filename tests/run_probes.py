"""What tests look at from outside a run: the pids its ranks wrote, and the run folders a
launcher process left behind."""

from __future__ import annotations

import tempfile
import time
from pathlib import Path


def run_folders_of(pid: int, seconds: float = 10.0) -> list[Path]:
    """Run folders a launcher with this pid left behind (waits a little for cleanup)."""
    deadline = time.monotonic() + seconds
    while True:
        left = list(Path(tempfile.gettempdir()).glob(f"ddp_lab-{pid}-*"))
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.1)


def wait_for_pids(folder: Path, count: int, seconds: float = 60) -> list[int]:
    """The pids of ``count`` ranks that each wrote ``rank*.pid`` into ``folder``."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        files = list(folder.glob("rank*.pid"))
        if len(files) == count:
            time.sleep(0.1)
            return [int(f.read_text()) for f in files]
        time.sleep(0.05)
    raise AssertionError("the ranks did not start")
