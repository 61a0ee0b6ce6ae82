"""Spans from a ``torch.profiler`` trace, on the same clock as ``time.time()``.

The profiler records every operator, and also each collective as its process group's worker
thread runs it: ProcessGroupGloo's ``AsyncWork`` carries a ``RecordFunction`` named
``gloo:<collective>`` onto the worker thread that executes it. Those spans are the real start
and end of the communication, which nothing in Python sees (a communication hook only sees
when work is handed over, and a future's callback when it is done). The trace exported with
``prof.export_chrome_trace`` (the format of https://ui.perfetto.dev and chrome://tracing)
gives each event's ``ts`` in microseconds after ``baseTimeNanoseconds``, an epoch time, so
the spans line up with ``time.time()`` stamps taken in the same process.
"""

from __future__ import annotations

import json
import os
import tempfile
from dataclasses import dataclass


@dataclass(frozen=True)
class TraceSpan:
    """One complete event of a trace: its name, category, thread id, start and end in
    seconds since the epoch."""

    name: str
    category: str
    thread: str
    start: float
    end: float


def read_chrome_trace(path: str) -> list[TraceSpan]:
    """Every complete ("X") event of an exported trace, sorted by start."""
    with open(path) as f:
        trace = json.load(f)
    base_us = trace.get("baseTimeNanoseconds", 0) / 1e3
    spans = [TraceSpan(e["name"], e.get("cat", ""), str(e.get("tid", "")),
                       (base_us + e["ts"]) / 1e6, (base_us + e["ts"] + e.get("dur", 0)) / 1e6)
             for e in trace.get("traceEvents", []) if e.get("ph") == "X"]
    return sorted(spans, key=lambda s: s.start)


def spans_of(prof, path: str | None = None) -> list[TraceSpan]:
    """Export ``prof`` (a finished ``torch.profiler.profile``) and read it back. With no
    ``path`` the trace goes to a private temporary folder that is removed afterwards."""
    if path is not None:
        prof.export_chrome_trace(path)
        return read_chrome_trace(path)
    with tempfile.TemporaryDirectory(prefix="ddp_lab_trace_") as folder:
        return spans_of(prof, os.path.join(folder, "trace.json"))


def collective_spans(spans: list[TraceSpan], name: str = "gloo:all_reduce",
                     within: tuple[float, float] | None = None) -> list[TraceSpan]:
    """The spans of one collective (as the worker threads ran it), optionally only those
    that started inside ``within`` = (start, end)."""
    return [s for s in spans if s.name == name
            and (within is None or within[0] <= s.start <= within[1])]


def most_in_flight(spans: list[tuple[float, float]]) -> int:
    """The largest number of (start, end) intervals that overlap at one moment."""
    edges = sorted([(s, 1) for s, _ in spans] + [(e, -1) for _, e in spans],
                   key=lambda edge: (edge[0], edge[1]))
    level = most = 0
    for _, step in edges:
        level += step
        most = max(most, level)
    return most
