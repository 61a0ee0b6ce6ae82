"""Notebook 08, part 4: one rank crashes; who is the culprit and who only fell with it?

When a rank dies, its peers are usually waiting in a collective with it, and they fail
too, with a broken connection. Their errors are loud and come in numbers, so the useful
question is always "which failure came first, for a reason of its own?". ``ddp_lab``
answers it in ``WorkerError`` (``.rank``, ``.knock_on``); torchrun answers it in its
"Root Cause (first observed failure)" summary, fed by the error files that the ``@record``
decorator writes.
"""

from __future__ import annotations

import json
from datetime import datetime
import tempfile
from dataclasses import dataclass
from pathlib import Path

from ddp_lab.launch.torchrun.command import TorchrunResult, torchrun
from ddp_lab.scripts import script_path

SCRIPT = script_path("crash_rank.py")


def crash_args(crash_rank: int = 1, crash_step: int = 2) -> list[str]:
    return ["--crash-rank", str(crash_rank), "--crash-step", str(crash_step)]


@dataclass(frozen=True)
class TorchrunCrash:
    """A failed torchrun job: its output, and the error files its workers left, by
    (attempt, local rank), as written by ``@record`` to TORCHELASTIC_ERROR_FILE."""

    result: TorchrunResult
    error_files: dict[tuple[int, int], dict]

    @property
    def summary(self) -> str:
        """torchrun's closing report: every failure, then the root cause."""
        return self.result.section("FAILED", "=" * 20)


def crash_under_torchrun(nproc: int = 2, crash_rank: int = 1, crash_step: int = 2,
                         env: dict | None = None, timeout: float = 120.0) -> TorchrunCrash:
    """Run ``crash_rank.py`` under real torchrun with ``--log-dir`` in a temporary folder,
    so that the workers' error files can be read once the job is over."""
    with tempfile.TemporaryDirectory(prefix="ddp_lab-torchrun-") as log_dir:
        result = torchrun([SCRIPT, *crash_args(crash_rank, crash_step)], nproc, env=env,
                          timeout=timeout, log_dir=log_dir)
        return TorchrunCrash(result, read_error_files(Path(log_dir)))


def read_error_files(log_dir: Path) -> dict[tuple[int, int], dict]:
    """torchrun's log folder holds ``<run>/attempt_<k>/<local_rank>/error.json``."""
    found = {}
    for path in sorted(log_dir.glob("*/attempt_*/*/error.json")):
        attempt = int(path.parent.parent.name.removeprefix("attempt_"))
        found[attempt, int(path.parent.name)] = json.loads(path.read_text())
    return found


def error_file_summary(record: dict) -> dict[str, str]:
    """The parts of an error file that matter: the message, and when (torchrun compares
    these timestamps, whole seconds, to pick the root cause)."""
    message = record["message"]
    if isinstance(message, str):  # written by a crash handler rather than by @record
        return {"message": message}
    extra = message["extraInfo"]
    when = datetime.fromtimestamp(int(extra["timestamp"])).isoformat(sep=" ")
    return {"message": message["message"], "timestamp": f"{extra['timestamp']} ({when})",
            "py_callstack": f"{len(extra['py_callstack'].splitlines())} lines: the "
                            "traceback quoted in torchrun's summary"}


def excepthook_lines(message: str = "the error") -> list[str]:
    """What an uncaught ``ValueError(message)`` prints on this rank once the default group
    exists, whatever launched it: ``init_process_group`` replaced ``sys.excepthook`` with
    torch's ``_distributed_excepthook``, which prefixes every line with ``[rankN]:``."""
    import io
    import sys
    from contextlib import redirect_stderr
    try:
        raise ValueError(message)
    except ValueError:
        with redirect_stderr(io.StringIO()) as err:
            sys.excepthook(*sys.exc_info())
    return [sys.excepthook.__name__, *err.getvalue().splitlines()]
