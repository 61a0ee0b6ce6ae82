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
_LAUNCHER_FILES = ("ddp_lab/launch/worker.py", "ddp_lab/launch/cell.py",
                   "ddp_lab/launch/zygote.py", "<frozen runpy>")


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
    for header, frames in threads:
        title = "Stack (oldest call first)" if len(threads) == 1 else f"{header}, oldest call first"
        user_frames = _without_launcher(list(reversed(frames)))
        blocks.append("\n".join([title + ":"] + [_frame_text(f) for f in user_frames]))
    return "\n\n".join(blocks)


def _without_launcher(frames: list) -> list:
    """Drop the outer frames that are ddp_lab's own start-up, keep the user's calls."""
    start = 0
    while start < len(frames) - 1 and _is_launcher_file(frames[start][0]):
        start += 1
    return frames[start:]


def _is_launcher_file(file: str) -> bool:
    return file.replace("\\", "/").endswith(_LAUNCHER_FILES)


def _split_threads(text: str) -> list[tuple[str, list[tuple[str, int, str]]]]:
    threads: list = []
    for line in text.splitlines():
        if match := _THREAD.match(line):
            threads.append((f"{match.group(1)} {match.group(2)}", []))
        elif (frame := _FRAME.match(line)) and threads:
            threads[-1][1].append((frame["file"], int(frame["line"]), frame["func"]))
    return threads


def _is_launcher_thread(frames) -> bool:
    return any(_is_launcher_file(f[0]) and f[2] == "watch" for f in frames)


def _frame_text(frame: tuple[str, int, str]) -> str:
    file, line, func = frame
    source = linecache.getline(file, line).strip()
    return f'  File "{file}", line {line}, in {func}' + (f"\n    {source}" if source else "")


def describe_crash(log: str) -> str:
    """A rank that died without a Python exception (a segfault, say): faulthandler's
    report from its log, reformatted, or the log's last lines."""
    fatal = [line for line in log.splitlines() if line.startswith("Fatal Python error")]
    stack = format_dump(log)
    if fatal and stack:
        return fatal[-1] + "\n\n" + stack
    return "\n".join(log.splitlines()[-40:])


def waiting_in(stack: str) -> str | None:
    """The innermost torch.distributed call of a formatted stack, e.g. 'all_reduce'."""
    calls = re.findall(r'File "[^"]*torch[/\\]distributed[/\\][^"]*", line \d+, in (\w+)', stack)
    public = [c for c in calls if not c.startswith("_") and c != "wrapper"]
    return public[-1] if public else None
