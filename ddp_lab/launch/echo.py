"""Where the ranks' output goes while a run is going: one ``[rank N]`` line per line (an
agent's own lines behind its label, ``[torchrun]``, ``[node0]``), never two ranks in one
line, and progress bars (``\\r`` updates, as tqdm writes) that stay readable in a notebook,
a terminal and a CI log.

In a Jupyter kernel the latest progress of every rank lives in one display area updated
in place; elsewhere it is printed as an ordinary line at most every few seconds (a redrawn
line cannot share a terminal with other ranks' lines).
"""

from __future__ import annotations

import sys
import time

TERMINAL_STATUS_EVERY_S = 5.0
NOTEBOOK_STATUS_EVERY_S = 0.25


class PlainEcho:
    """Lines to stdout; progress as a line at most every TERMINAL_STATUS_EVERY_S per rank."""

    status_every_s = TERMINAL_STATUS_EVERY_S

    def __init__(self):
        self.last_status_at: dict[int, float] = {}

    def line(self, rank: int | str, text: str) -> None:
        sys.stdout.write(f"[{tag(rank)}] {text}\n")
        sys.stdout.flush()

    def show(self, rank: int, lines: list[str], status: str | None = None) -> None:
        """What one read brought for a rank (see ``output.Output``)."""
        for text in lines:
            self.line(rank, text)
        if status is not None:
            self.status(rank, status)

    def status(self, rank: int, text: str) -> None:
        now = time.monotonic()
        if now - self.last_status_at.get(rank, -1e9) >= self.status_every_s:
            self.last_status_at[rank] = now
            self.show_status(rank, text)

    def show_status(self, rank: int, text: str) -> None:
        self.line(rank, text)

    def close(self) -> None:
        pass


class NotebookEcho(PlainEcho):
    """Lines as cell output; every rank's latest progress in one area updated in place."""

    status_every_s = NOTEBOOK_STATUS_EVERY_S

    def __init__(self):
        super().__init__()
        self.statuses: dict[int, str] = {}
        self.handle = None

    def line(self, rank: int, text: str) -> None:
        super().line(rank, text)
        if self.statuses.pop(rank, None) is not None:  # a finished bar ends with a line
            self._render()

    def status(self, rank: int, text: str) -> None:
        self.statuses[rank] = text
        super().status(rank, text)

    def show_status(self, rank: int, text: str) -> None:
        self._render()

    def _render(self) -> None:
        from IPython.display import display
        shown = {"text/plain": "\n".join(f"[{tag(r)}] {t}" for r, t in sorted(self.statuses.items()))}
        if self.handle is None:
            self.handle = display(shown, raw=True, display_id=True)
        else:
            self.handle.update(shown, raw=True)

    def close(self) -> None:
        if self.handle is not None:  # the final state, even within the throttle window
            self._render()


class SilentEcho(PlainEcho):
    def line(self, rank: int | str, text: str) -> None:
        pass

    def status(self, rank: int, text: str) -> None:
        pass


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
