"""Where the ranks' output goes while a run is going: one ``[rank N]`` line per line (an
agent's own lines behind its label, ``[torchrun]``, ``[node0]``), never two ranks in one
line, and progress bars (``\\r`` updates, as tqdm writes) that stay readable in a notebook,
a terminal and a CI log.

The echo only shows; ``res.logs`` is kept by the run (session.py), whole, whatever the
echo shows. In a Jupyter kernel every write that is flushed becomes one message to the front
end, and Jupyter's server drops a kernel's output for a while once it exceeds its IOPub rate
limits (``iopub_data_rate_limit``, 1 MB/s, and ``iopub_msg_rate_limit``, 1000 messages/s,
averaged over ``rate_limit_window``, 3 s; the cell's later prints are lost with it). So the
notebook echo sends lines in batches, at most one message per ``BATCH_EVERY_S``, and within a
byte budget well under that limit; lines beyond the budget are left out of the echo and the
cell says how many, and where to find them. The latest progress of every rank lives in one
display area updated in place; in a terminal it is an ordinary line at most every few seconds
(a redrawn line cannot share a terminal with other ranks' lines).
"""

from __future__ import annotations

import sys
import time

TERMINAL_STATUS_EVERY_S = 5.0
NOTEBOOK_STATUS_EVERY_S = 0.25
BATCH_EVERY_S = 0.1             # at most 10 stream messages a second
ECHO_BYTES_PER_S = 150_000      # sustained; a fifth of the server's 1 MB/s, for other output
ECHO_BURST_BYTES = 300_000      # what a quiet cell may print at once


class PlainEcho:
    """Lines to stdout, one write per read; progress as a line at most every
    TERMINAL_STATUS_EVERY_S per rank."""

    status_every_s = TERMINAL_STATUS_EVERY_S

    def __init__(self):
        self.last_status_at: dict[int, float] = {}

    def line(self, owner: int | str, text: str) -> None:
        self.show(owner, [text])

    def show(self, owner: int | str, lines: list[str], status: str | None = None) -> None:
        """What one read brought for a rank or an agent (see ``output.Output``)."""
        if lines:
            self.write("".join(f"[{tag(owner)}] {text}\n" for text in lines))
        if status is not None:
            self.status(owner, status)

    def write(self, text: str) -> None:
        sys.stdout.write(text)
        sys.stdout.flush()

    def status(self, rank: int, text: str) -> None:
        now = time.monotonic()
        if now - self.last_status_at.get(rank, -1e9) >= self.status_every_s:
            self.last_status_at[rank] = now
            self.show_status(rank, text)

    def show_status(self, rank: int, text: str) -> None:
        self.show(rank, [text])

    def note(self, text: str) -> None:
        """The launcher's own line (a heartbeat), after every rank line shown so far: the
        echo is the one writer to the cell."""
        self.write(text)

    def wake_at(self) -> float:
        """When ``tick`` has something to write (the reader's loop wakes up for it)."""
        return float("inf")

    def tick(self) -> None:
        """Write what is due; the reader calls it on every turn of its loop."""

    def close(self) -> None:
        pass


class ByteBudget:
    """A token bucket: ``rate`` bytes a second on average, ``burst`` at once."""

    def __init__(self, rate: float, burst: float):
        self.rate, self.burst = rate, burst
        self.tokens, self.at = burst, time.monotonic()

    def refill(self) -> float:
        now = time.monotonic()
        self.tokens = min(self.burst, self.tokens + (now - self.at) * self.rate)
        self.at = now
        return self.tokens

    def take(self, size: int) -> bool:
        if size > self.refill():
            return False
        self.tokens -= size
        return True


class NotebookEcho(PlainEcho):
    """Lines as cell output in batches within a byte budget; every rank's latest progress
    in one area updated in place."""

    status_every_s = NOTEBOOK_STATUS_EVERY_S

    def __init__(self):
        super().__init__()
        self.statuses: dict[int, str] = {}
        self.handle = None
        self.batch: list[str] = []
        self.written_at = -float("inf")
        self.budget = ByteBudget(ECHO_BYTES_PER_S, ECHO_BURST_BYTES)
        self.left_out = 0   # lines not shown since the last notice

    def show(self, owner: int | str, lines: list[str], status: str | None = None) -> None:
        for text in lines:
            self._add(f"[{tag(owner)}] {text}\n")
        if lines and self.statuses.pop(owner, None) is not None:  # a bar ended with a line
            self._render()
        if status is not None:
            self.status(owner, status)
        self.tick()

    def _add(self, text: str) -> None:
        """Into the batch if the budget allows; once it did not, lines are left out until
        half the burst is back (else every refill would show one line and a notice)."""
        if self.left_out and self.budget.refill() < ECHO_BURST_BYTES / 2:
            self.left_out += 1
        elif self.left_out:
            self.batch.append(left_out_notice(self.left_out))
            self.left_out = 0
            self._add(text)
        elif self.budget.take(len(text)):
            self.batch.append(text)
        else:
            self.left_out = 1

    def note(self, text: str) -> None:
        self.batch.append(text)
        self._write_batch()

    def wake_at(self) -> float:
        return self.written_at + BATCH_EVERY_S if self.batch else float("inf")

    def tick(self) -> None:
        if self.batch and time.monotonic() >= self.wake_at():
            self._write_batch()

    def _write_batch(self) -> None:
        text, self.batch = "".join(self.batch), []
        self.written_at = time.monotonic()
        self.write(text)

    def status(self, rank: int, text: str) -> None:
        self.statuses[rank] = text
        super().status(rank, text)

    def show_status(self, rank: int, text: str) -> None:
        self._render()

    def _render(self) -> None:
        from IPython.display import display
        text = "\n".join(f"[{tag(r)}] {t}" for r, t in sorted(self.statuses.items()))
        shown = {"text/plain": text}
        if self.handle is None:
            self.handle = display(shown, raw=True, display_id=True)
        else:
            self.handle.update(shown, raw=True)

    def close(self) -> None:
        if self.left_out:
            self.batch.append(left_out_notice(self.left_out))
            self.left_out = 0
        if self.batch:
            self._write_batch()
        if self.handle is not None:  # the final state, even within the throttle window
            self._render()


class SilentEcho(PlainEcho):
    def show(self, owner: int | str, lines: list[str], status: str | None = None) -> None:
        pass


def left_out_notice(count: int) -> str:
    return (f"[ddp_lab] {count} line{'s' * (count != 1)} not shown here: the ranks print faster "
            "than a notebook can display; res.logs (or err.logs) keep them (a rank's first and "
            "last megabytes when it prints more)\n")


def tag(owner: int | str) -> str:
    """``rank 3`` for a rank; a label (``torchrun``, ``node0``) as it is."""
    return f"rank {owner}" if isinstance(owner, int) else owner


def make_echo(enabled: bool) -> PlainEcho:
    if not enabled:
        return SilentEcho()
    return NotebookEcho() if in_notebook_kernel() else PlainEcho()


def in_notebook_kernel() -> bool:
    ipython = sys.modules.get("IPython")
    shell = ipython.get_ipython() if ipython else None
    return shell is not None and hasattr(shell, "kernel")
