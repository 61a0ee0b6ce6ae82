"""Turn a stuck rank's faulthandler dump into a readable stack: oldest call first, with the
source line of every frame (notebook cells included, from this kernel's linecache) and the
launcher's own lifeline thread left out."""

from __future__ import annotations

import linecache
import re
import time
from pathlib import Path

_FRAME = re.compile(r'^\s*File "(?P<file>.*)", line (?P<line>\d+) in (?P<func>.*)$')
_THREAD = re.compile(r"^(Current thread|Thread) (0x[0-9a-f]+)")
_OURS = ("ddp_lab/worker.py", "ddp_lab\\worker.py")


def read_stack_dump(path: Path, until: float) -> str:
    """Wait (until the monotonic time ``until``) for the dump to be written, then format it."""
    text, seen = "", -1
    while time.monotonic() < until:
        text = path.read_text() if path.exists() else ""
        if text and len(text) == seen:
            break
        seen = len(text)
        time.sleep(0.05)
    return format_dump(text) if text else "(the rank did not answer with a stack)"


def format_dump(text: str) -> str:
    threads = [t for t in _split_threads(text) if not _is_launcher_thread(t[1])]
    blocks = []
    for index, (header, frames) in enumerate(threads):
        title = "Stack (oldest call first)" if len(threads) == 1 else f"{header}, oldest call first"
        blocks.append("\n".join([title + ":"] + [_frame_text(f) for f in reversed(frames)]))
    return "\n\n".join(blocks)


def _split_threads(text: str) -> list[tuple[str, list[tuple[str, int, str]]]]:
    threads: list = []
    for line in text.splitlines():
        if match := _THREAD.match(line):
            threads.append((f"{match.group(1)} {match.group(2)}", []))
        elif (frame := _FRAME.match(line)) and threads:
            threads[-1][1].append((frame["file"], int(frame["line"]), frame["func"]))
    return threads


def _is_launcher_thread(frames) -> bool:
    return any(f[0].endswith(_OURS) and f[2] == "watch" for f in frames)


def _frame_text(frame: tuple[str, int, str]) -> str:
    file, line, func = frame
    source = linecache.getline(file, line).strip()
    return f'  File "{file}", line {line}, in {func}' + (f"\n    {source}" if source else "")


def waiting_in(stack: str) -> str | None:
    """The innermost torch.distributed call of a formatted stack, e.g. 'all_reduce'."""
    calls = re.findall(r'File "[^"]*torch[/\\]distributed[/\\][^"]*", line \d+, in (\w+)', stack)
    public = [c for c in calls if not c.startswith("_") and c != "wrapper"]
    return public[-1] if public else None
