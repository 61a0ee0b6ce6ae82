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
# faulthandler lists a thread with no Python frame ("<no Python frame>") when a thread
# started in C++ holds a Python thread state: it holds or waits for the GIL.
NO_PYTHON_FRAME = "  (no Python frame: a thread started in C++, holding or waiting for the GIL)"
_LAUNCHER_FILES = ("ddp_lab/launch/rank/main.py", "ddp_lab/launch/rank/cell.py",
                   "ddp_lab/launch/rank/pinned_rendezvous.py",
                   "ddp_lab/launch/forkserver/server.py", "<frozen runpy>",
                   "ddp_lab/launch/live/rank_loop.py")


NO_STACK = "(the rank did not answer with a stack)"


def collect_stacks(server, pids: dict[int, int], files, offsets=None) -> dict[int, str]:
    """Ask each stuck rank (rank -> pid) for its stack and read them all within
    STACK_WAIT_S: SIGUSR1 makes faulthandler write it from the C signal handler, so it comes
    even from inside a blocked collective (rank/main.py arms it). A rank that exits instead
    (a peer that is failing too) answers nothing, and costs the others no time."""
    import signal

    from ddp_lab.launch.deadlines import STACK_WAIT_S
    for pid in pids.values():
        server.signal(pid, signal.SIGUSR1)
    until = time.monotonic() + STACK_WAIT_S
    return read_stack_dumps({rank: files.stack(rank) for rank in pids}, until, offsets or {})


def read_stack_dumps(paths: dict[int, Path], until: float, offsets: dict[int, int]) -> dict:
    """Wait (until the monotonic time ``until``) for every dump to be written, reading them
    side by side, then format them. A live rank's file holds every dump it was asked for:
    ``offsets[rank]`` is where this one starts."""
    texts, seen, pending = dict.fromkeys(paths, ""), dict.fromkeys(paths, -1), set(paths)
    while pending and time.monotonic() < until:
        for rank in sorted(pending):
            path = paths[rank]
            texts[rank] = path.read_text()[offsets.get(rank, 0):] if path.exists() else ""
            if texts[rank] and len(texts[rank]) == seen[rank]:
                pending.discard(rank)
            seen[rank] = len(texts[rank])
        time.sleep(0.05)
    return {rank: format_dump(text) if text else NO_STACK for rank, text in texts.items()}


def format_dump(text: str) -> str:
    threads = [t for t in _split_threads(text) if not _is_launcher_thread(t[1])]
    blocks = []
    for header, frames in threads:
        title = "Stack (oldest call first)" if len(threads) == 1 else f"{header}, oldest call first"
        user_frames = _without_launcher(list(reversed(frames)))
        lines = [_frame_text(f) for f in user_frames] or [NO_PYTHON_FRAME]
        blocks.append("\n".join([title + ":"] + lines))
    return "\n\n".join(blocks)


def _without_launcher(frames: list) -> list:
    """Drop the outer frames that are ddp_lab's own start-up, keep the user's calls."""
    start = 0
    while start < len(frames) - 1 and is_launcher_file(frames[start][0]):
        start += 1
    return frames[start:]


def is_launcher_file(file: str) -> bool:
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
    return any(is_launcher_file(f[0]) and f[2] == "watch" for f in frames)


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


def no_python_running(log: str) -> bool:
    """Whether the last fatal-signal report in ``log`` (faulthandler's, see rank/main.py and
    torchrun's PYTHONFAULTHANDLER=1) lists threads and none of them runs Python code. The
    main thread runs the script's module frame until the script ends, so then the process
    died after its script had finished: in the interpreter's exit."""
    if "Fatal Python error" not in log:
        return False
    threads = _split_threads(log.rpartition("Fatal Python error")[2])
    return bool(threads) and not any(frames for _, frames in threads)


def waiting_in(stack: str) -> str | None:
    """The innermost torch.distributed call of a formatted stack, e.g. 'all_reduce'; or, when
    there is none but a thread started in C++ waits for the GIL, a process group's destructor
    (see in_teardown)."""
    calls = re.findall(r'File "[^"]*torch[/\\]distributed[/\\][^"]*", line \d+, in (\w+)', stack)
    public = [c for c in calls if not c.startswith("_") and c != "wrapper"]
    if public:
        return public[-1]
    return DESTRUCTOR if NO_PYTHON_FRAME in stack else None


DESTRUCTOR = "a process group's destructor"
TEARDOWN_ADVICE = (
    "No stuck rank was in a collective: each was tearing a process group down, in "
    "destroy_process_group() or in a group's destructor (run when the last object holding "
    "the group is freed). A thread listed without a Python frame is one the group started "
    "in C++, waiting for the GIL that the main thread holds while it waits for that thread "
    "to end: a deadlock. The usual cause is destroy_process_group() called while a DDP "
    "model still lives, as the DDP tutorial's cleanup() and its elastic_ddp.py do: free "
    "the model first (del ddp_model), then destroy the group. Importing "
    "torch.distributed.nn before init_process_group (the fix for an abort at exit) makes "
    "this hang likelier unless the model goes first: the model then holds the group's "
    "last reference.")


def in_teardown(stack: str) -> bool:
    """Stuck destroying a process group rather than in a collective: inside
    destroy_process_group, or in a group's destructor (a deadlock over the GIL with one of
    the group's C++ threads, see ddp_lab/launch/rank/teardown.py)."""
    return waiting_in(stack) in ("destroy_process_group", DESTRUCTOR)


def hang_advice(stacks: list[str]) -> str | None:
    """What to tell the user when every stuck rank was tearing down (None otherwise: the
    generic advice about collectives fits)."""
    return TEARDOWN_ADVICE if stacks and all(in_teardown(s) for s in stacks) else None
