"""The exceptions a run raises: what failed, on which rank, and what to do about it.

They are plain data plus a message, so a notebook can both print them and inspect them
(``err.rank``, ``err.traceback``, ``err.stuck_ranks``...) in an assert cell.
"""

from __future__ import annotations

import copyreg
import re


class DistributedRunError(RuntimeError):
    """Base class of every failure of a multi-rank run started by ddp_lab."""

    def __reduce__(self):
        """Pickle as what it is now: its message (``args``, which a live call extends with
        what became of the ranks) and every field, rebuilt without calling ``__init__``
        (whose arguments are not the message), so a run inside a process pool or a batch
        tool can hand its error back."""
        return copyreg.__newobj__, (type(self), *self.args), self.__dict__

    def _render_traceback_(self) -> list[str]:
        """IPython shows these lines instead of a traceback through the launcher: the
        message already holds the rank's own traceback, which is what matters."""
        return f"{type(self).__name__}: {self}".splitlines()


class WorkerError(DistributedRunError):
    """A rank failed. ``rank`` is the root cause; ``knock_on`` lists ranks that only died
    because of it (a peer's collective broke, or the launcher stopped them);
    ``also_failed`` lists ranks that failed on their own too (often the same bug).

    Attributes: rank, exitcode, traceback (str, the root-cause rank's), logs (list of every
    rank's output), knock_on and also_failed (dict rank -> one-line reason), values (each
    rank's value where it arrived, else None), finished (True when the root-cause rank had
    finished its code and died in teardown, verdict/died_after_return.py), victims (dict
    rank -> its timeout: ranks that timed out in a collective ``rank`` never joined,
    verdict/timeouts.py), same_on (the ranks that all failed the same way, when that is
    every rank: no root cause then, and ``rank`` is the first of them, verdict/everywhere.py),
    headline (the verdict's first line, where it has one of its own).
    """

    def __init__(self, rank: int, exitcode: int | None, traceback: str, logs: list[str],
                 knock_on: dict[int, str] | None = None, hint: str = "",
                 also_failed: dict[int, str] | None = None, values: list | None = None,
                 finished: bool = False, victims: dict[int, str] | None = None,
                 same_on: list[int] | None = None, headline: str = ""):
        self.rank = rank
        self.victims = dict(victims or {})
        self.same_on = list(same_on or [])
        self.headline = headline
        self.values = values if values is not None else [None] * len(logs)
        self.finished = finished
        self.hint = hint
        self.also_failed = dict(also_failed or {})
        self.exitcode = exitcode
        self.traceback = traceback
        self.logs = logs
        self.knock_on = dict(knock_on or {})
        super().__init__(self._message())

    def _message(self) -> str:
        if self.headline:  # the verdict's own: victims of a timeout, the same error everywhere
            lines = [self.headline, "", self.traceback.rstrip() or "(no stack or traceback "
                     "of it: see its log)"]
        elif self.finished:  # its code returned; the hint says what is known
            lines = [f"rank {self.rank} finished its work, then its process died on the way "
                     f"out ({describe_exit(self.exitcode)}): in teardown, after its code had "
                     "returned.", "", self.hint, "",
                     self.traceback.rstrip() or "(no report: see its log)"]
        elif self.exitcode == 0:  # it left without an error; the hint says how
            lines = [f"rank {self.rank} left the run early (exit code 0, no error of its "
                     "own); it is the root cause."]
        else:
            lines = [f"rank {self.rank} failed ({describe_exit(self.exitcode)}); it is the "
                     "root cause.", "",
                     self.traceback.rstrip() or "(no Python traceback: see its log)"]
        if self.hint and not self.finished:
            lines += ["", self.hint]
        if self.victims:
            lines += ["", f"Victims (they timed out waiting for rank {self.rank}):"]
            lines += [f"  rank {r}: {why}" for r, why in sorted(self.victims.items())]
        if self.knock_on:
            lines += ["", "Knock-on failures (they stopped because rank "
                      f"{self.rank} did, look at rank {self.rank} first):"]
            lines += [f"  rank {r}: {why}" for r, why in sorted(self.knock_on.items())]
        if self.also_failed:
            lines += ["", "These ranks failed on their own as well:"]
            lines += [f"  rank {r}: {why}" for r, why in sorted(self.also_failed.items())]
        lines += ["", "Each rank's output is in err.logs[rank] (a long one: its first and last "
                  "megabytes)."]
        return "\n".join(lines)


class ForkServerUnresponsive(DistributedRunError):
    """The fork server stopped answering (stopped with SIGSTOP, or wedged): the launcher
    killed it with the run's ranks; the next run starts a new one."""


class HostUnreachable(DistributedRunError):
    """A host of ranks on several hosts was lost (a cut link, a host or agent stopped or
    killed, an agent that failed): its ranks are gone, the other hosts' were stopped
    (``session`` is "stopped"; live ranks: ``restart()`` starts new ones everywhere)."""

    session = "stopped"


class UnreadableResult(DistributedRunError):
    """Every rank finished, but what some ranks returned cannot be unpickled in this process.

    Attributes: rank (the first such rank), reasons (dict rank -> the unpickling error),
    values (every rank's value, None where unreadable), logs.
    """

    def __init__(self, reasons: dict[int, str], values: list, logs: list[str]):
        self.reasons = dict(sorted(reasons.items()))
        self.rank = min(self.reasons)
        self.values = values
        self.logs = logs
        super().__init__(self._message())

    def _message(self) -> str:
        lines = [f"rank {self.rank} finished, but its return value cannot be unpickled here: "
                 f"{self.reasons[self.rank]}"]
        lines += [f"  rank {r} too: {why}" for r, why in self.reasons.items() if r != self.rank]
        lines += ["", "A rank's value is pickled on the rank and rebuilt in this process, so "
                  "it must be made of things this process can import and rebuild (not a class "
                  "only the ranks can import, nor one whose __reduce__ or __setstate__ fails). "
                  "Return plain data instead: numbers, strings, lists, dicts, CPU tensors.",
                  "The other ranks' values are in err.values (None where unreadable); each "
                  "rank's output is in err.logs[rank]."]
        return "\n".join(lines)


class WorkerTimeout(DistributedRunError):
    """The run did not finish within ``timeout`` seconds.

    ``stuck_ranks`` are the ranks still running at the deadline; ``stacks[rank]`` is where
    each one was waiting (Python stack, oldest call first), taken just before they were killed.
    """

    def __init__(self, timeout: float, stuck_ranks: list[int], stacks: dict[int, str],
                 logs: list[str]):
        self.timeout = timeout
        self.stuck_ranks = list(stuck_ranks)
        self.stacks = dict(stacks)
        self.logs = logs
        super().__init__(self._message())

    def _message(self) -> str:
        done = sorted(set(range(len(self.logs))) - set(self.stuck_ranks))
        from ddp_lab.launch.verdict.stacks import hang_advice, waiting_in
        advice = hang_advice([self.stacks.get(r, "") for r in self.stuck_ranks])
        lines = [f"timed out after {self.timeout:g} s: ranks {self.stuck_ranks} were still "
                 f"running" + (f" (ranks {done} had finished)." if done else "."),
                 advice or "A collective that some rank never joins, or a send/recv with no "
                 "matching peer, waits until the process group's timeout (torch's default: "
                 "30 min on gloo, 10 on NCCL; ddp_lab sets it to the run's timeout + 60 s, so "
                 "the run's timeout stops the ranks first): check that every rank calls the "
                 "same collectives in the same order (uneven data is the usual cause), or "
                 "raise timeout= if the work is just slow.", ""]
        for rank in self.stuck_ranks:
            stack = self.stacks.get(rank, "(no stack)")
            where = waiting_in(stack)
            lines += [f"rank {rank} was here" + (f", waiting in {where}:" if where else ":"),
                      _indent(stack), ""]
        return "\n".join(lines).rstrip()


def describe_ranks(ranks: list[int]) -> str:
    """'rank 3', 'ranks 0-3' or 'ranks 0, 2'."""
    if len(ranks) == 1:
        return f"rank {ranks[0]}"
    if ranks == list(range(ranks[0], ranks[-1] + 1)):
        return f"ranks {ranks[0]}-{ranks[-1]}"
    return "ranks " + ", ".join(map(str, ranks))


def describe_exit(exitcode: int | None) -> str:
    if exitcode is None:
        return "no exit code"
    if exitcode < 0:
        import signal
        try:
            return f"killed by {signal.Signals(-exitcode).name}"
        except ValueError:
            return f"killed by signal {-exitcode}"
    return f"exit code {exitcode}"


def _indent(text: str) -> str:
    return "\n".join("    " + line for line in text.rstrip().splitlines())


def short_message(message: str, limit: int = 120) -> str:
    """First line, without gloo's '[/path/to/pair.cc:553] ' prefix, cut at a word."""
    first = re.sub(r"^\[[^\]]*\]\s*", "", (message.strip().splitlines() or [""])[0])
    return first if len(first) <= limit else first[:limit].rsplit(" ", 1)[0] + " ..."


def safe_message(exc: BaseException) -> str:
    """``str(exc)``, or the best that can be said when the exception's own ``__str__``
    raises: a bug in an exception class must not hide the error it reports."""
    try:
        return str(exc)
    except Exception as failure:  # noqa: BLE001
        why = type(failure).__name__
    try:
        shown = repr(exc)
    except Exception:  # noqa: BLE001
        shown = f"<{type(exc).__name__} object>"
    return f"{shown} (its message could not be formatted: its __str__ raised {why})"
