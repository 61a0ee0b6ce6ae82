"""Worker scripts that run unchanged under ``torchrun`` and ``ddp_lab.run_script``."""

from pathlib import Path

SCRIPTS = Path(__file__).parent


def script_path(name: str) -> str:
    """Absolute path of a bundled script, e.g. ``script_path("all_reduce_once.py")``."""
    return str(SCRIPTS / name)
