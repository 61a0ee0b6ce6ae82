"""What the caller and the ranks agree on: the run's settings, one rank's instructions, and
the layout of the run folder through which results, errors and stacks come back.

Both sides import this module (the kernel to launch and read, every rank to write), so it
stays as light as the rank side must be: no torch, no launcher machinery.
"""

from __future__ import annotations

import os
import pickle
from dataclasses import dataclass
from pathlib import Path

# Names the run folder in every rank's environment: ``ddp_lab.report`` writes there, and
# torchrun passes it on to its workers, so the same script reports under both launchers.
RUN_DIR_VAR = "DDP_LAB_RUN_DIR"


@dataclass(frozen=True)
class LaunchConfig:
    """One run as the caller asked for it, checked (checks.py) before anything starts."""

    world_size: int
    backend: str
    timeout: float
    env: dict
    echo: bool = True
    script: str | None = None
    script_args: tuple = ()
    init_group: bool = True  # False for ddp_lab.spawn: fn(rank, ...) initializes its own
    network: object = None  # network.Network: a shaped run; None: plain loopback


@dataclass(frozen=True)
class RankSpec:
    """Everything a forked rank needs to become the process the user's code expects."""

    rank: int
    world_size: int
    run_dir: str
    env: dict
    cwd: str
    sys_path: tuple
    backend: str
    threads: int
    pg_timeout_s: float
    script: str | None = None  # None: call the pickled function in run_dir/payload.pkl
    script_args: tuple = ()
    init_group: bool = True
    network: bool = False  # forked into its own network namespace (switch.py)


class RunFiles:
    """Where a rank leaves its result, its error and its stack dump in the run folder."""

    def __init__(self, run_dir: str | os.PathLike):
        self.dir = Path(run_dir)
        self.payload = self.dir / "payload.pkl"

    def result(self, rank: int) -> Path:
        return self.dir / f"rank{rank}.result.pkl"

    def error(self, rank: int) -> Path:
        return self.dir / f"rank{rank}.error.pkl"

    def stack(self, rank: int) -> Path:
        return self.dir / f"rank{rank}.stack.txt"

    def finished(self, rank: int) -> Path:
        """Left by a rank once the user's function or script has returned: a death after
        it (in teardown) is told apart from a failure of the user's code."""
        return self.dir / f"rank{rank}.finished"

    def results(self) -> dict:
        """Every result in the folder by global rank: under torchrun the ranks are not
        known in advance (elastic restarts may change the world size)."""
        found = {int(path.name[4:].split(".")[0]): read_pickle(path)
                 for path in self.dir.glob("rank*.result.pkl")}
        return dict(sorted(found.items()))


def write_pickle(path: Path, value) -> None:
    """Pickle ``value`` (by value, with cloudpickle: a notebook's classes travel too) so that
    a reader never sees a half-written file: write aside, then rename over."""
    import cloudpickle
    tmp = path.with_suffix(".tmp")
    tmp.write_bytes(cloudpickle.dumps(value))
    os.replace(tmp, path)


def read_pickle(path: Path):
    """What ``write_pickle`` left there, or None when nothing was written."""
    try:
        return pickle.loads(path.read_bytes())
    except FileNotFoundError:
        return None
