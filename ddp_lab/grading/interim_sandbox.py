"""A stand-in for sandbox.py's ``run_sandboxed`` until it lands: a plain subprocess in its
own session with a wall-clock limit, behind the same signature. It isolates nothing; it is
deleted when sandbox.py is in."""

from __future__ import annotations

import os
import signal
import subprocess
from dataclasses import dataclass
from pathlib import Path

OUTPUT_BYTES = 1 << 20


@dataclass(frozen=True)
class SandboxResult:
    returncode: int
    stdout: str
    stderr: str
    timed_out: bool
    reason: str


def run_sandboxed(argv: list[str], folder: Path, *, wall_s: float, memory_bytes: int,
                  max_processes: int, env: dict | None = None) -> SandboxResult:
    process = subprocess.Popen(argv, cwd=folder, env=env, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, start_new_session=True)
    try:
        out, err = process.communicate(timeout=wall_s)
        timed_out = False
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        out, err = process.communicate()
        timed_out = True
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
    reason = f"ran past its {wall_s:g} s budget" if timed_out else ""
    return SandboxResult(process.returncode, _text(out), _text(err), timed_out, reason)


def _text(data: bytes) -> str:
    return data[-OUTPUT_BYTES:].decode(errors="replace")
