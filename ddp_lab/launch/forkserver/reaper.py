"""The fork server's ranks and everything they leave behind.

A rank's helpers do not always stay in its process group: a grandchild may call
``os.setsid()``, ignore SIGTERM, and outlive its parent. So the fork server is a child
subreaper (``process_tree.become_subreaper``): every orphan below it becomes its child, and
whatever is its child and not a live rank is a leftover of some run. A leftover is put down
once its run has no live rank (a helper of a running run may be in use), or at once when
the launcher kills its rank.

Putting down is SIGTERM, a grace, then SIGKILL of its whole tree: multiprocessing's
resource tracker ignores SIGTERM and, once every holder of its pipe is gone, unlinks the
semaphores a crashed rank leaked in /dev/shm; a SIGKILL straight away would leak them.
https://github.com/python/cpython/blob/3.11/Lib/multiprocessing/resource_tracker.py
"""

from __future__ import annotations

import os
import signal
import time

from ddp_lab.launch.config import RUN_DIR_VAR
from ddp_lab.launch.deadlines import LEFTOVER_GRACE_S
from ddp_lab.launch.forkserver import process_tree

UNKNOWN = None  # the run of a leftover that says nothing about where it came from


class Reaper:
    def __init__(self):
        self.subreaper = process_tree.become_subreaper()
        self.ranks: dict[int, str] = {}  # live rank pid -> its run folder
        self.groups: dict[int, str] = {}  # rank pid (= its process group) -> run, until it ends
        self.doomed: dict[int, tuple[float, str | None]] = {}  # pid -> (SIGKILL at, run)
        self.own: set[int] = set()  # the server's own helpers (store_host.py): no leftovers

    def add_rank(self, pid: int, run_dir: str) -> None:
        self.ranks[pid] = self.groups[pid] = run_dir

    def live_runs(self) -> set[str]:
        return set(self.ranks.values())

    def kill_rank(self, pid: int) -> None:
        """SIGKILL a rank now; its descendants get the grace."""
        if pid not in self.ranks:
            return
        tree = process_tree.freeze_and_list(pid)
        process_tree.send(pid, signal.SIGKILL)
        self.doom(tree, self.ranks[pid])

    def reaped(self, pid: int) -> str | None:
        """A child was reaped; the run folder of its run when it was a rank, else None."""
        self.doomed.pop(pid, None)
        run = self.ranks.pop(pid, None)
        if run is not None and not self.subreaper:  # no subreaper: its group is all we reach
            process_tree.kill_group(pid)
        return run

    def doom(self, pids: list[int], run: str | None) -> None:
        at = time.monotonic() + LEFTOVER_GRACE_S
        for pid in pids:
            if pid not in self.doomed and pid not in self.ranks:
                self.doomed[pid] = (at, run)
                process_tree.send(pid, signal.SIGTERM)
                process_tree.send(pid, signal.SIGCONT)

    def sweep(self) -> None:
        """SIGKILL the leftovers whose grace is over; doom those whose run is over.
        In this order: a leftover that dies after we looked at it stays listed until the
        next sweep, by which time its own orphans are our children and listed too."""
        self._expire()
        if self.subreaper:
            live = self.live_runs()
            for pid in process_tree.children(os.getpid()):
                if pid in self.ranks or pid in self.doomed or pid in self.own:
                    continue
                run = self.run_of(pid)
                if run not in live and (run is not UNKNOWN or not self.ranks):
                    self.doom([pid], run)

    def _expire(self) -> None:
        now = time.monotonic()
        for pid, (at, _run) in list(self.doomed.items()):
            if not process_tree.running(pid):
                del self.doomed[pid]
            elif now >= at:
                process_tree.kill_tree(pid)

    def run_of(self, pid: int) -> str | None:
        """Which run a leftover belongs to: by its process group (a rank's own, unless it
        moved), else by the run folder in its environment (an exec'd helper), else UNKNOWN."""
        import psutil
        try:
            run = self.groups.get(os.getpgid(pid))
            return run or psutil.Process(pid).environ().get(RUN_DIR_VAR, UNKNOWN)
        except (OSError, psutil.Error):
            return UNKNOWN

    def is_over(self, run: str) -> bool:
        """No rank and no leftover of ``run`` (or of no known run) is left."""
        if run in self.live_runs():
            return False
        return not any(r in (run, UNKNOWN) for _at, r in self.doomed.values())

    def forget(self, run: str) -> None:
        self.groups = {pid: r for pid, r in self.groups.items() if r != run}

    def next_deadline(self) -> float | None:
        return min((at for at, _run in self.doomed.values()), default=None)

    def kill_everything(self) -> None:
        """The launcher is gone: every rank now, every leftover after its grace."""
        for pid in list(self.ranks):
            self.kill_rank(pid)
        self.doom(process_tree.children(os.getpid()), UNKNOWN)
        until = time.monotonic() + LEFTOVER_GRACE_S + 5.0
        while (self.ranks or self.doomed) and time.monotonic() < until:
            self.reap()
            self.sweep()
            time.sleep(0.02)
        process_tree.kill_all(process_tree.descendants(os.getpid()))
        self.reap()

    def reap(self) -> list[tuple[str, int, int]]:
        """Reap every child that exited (ranks and adopted orphans alike); returns the
        ranks among them as (run folder, pid, exit code), exit code < 0: killed by that
        signal."""
        ranks = []
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return ranks
            if pid == 0:
                return ranks
            run = self.reaped(pid)
            if run is not None:
                ranks.append((run, pid, os.waitstatus_to_exitcode(status)))
