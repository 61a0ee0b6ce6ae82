"""Notebook 11b's exercise: the interleaved schedule's bubble, measured from every rank's
timeline with collectives.

Each rank holds only its own spans ``(label, start, end)`` (seconds on ``time.time()``'s
clock, two virtual stages' steps mixed). The bubble is the pipeline's idle share: 1 minus
all ranks' busy time over ``world_size x (last end anywhere - first start anywhere)``, the
same number on every rank. The check draws pipeline-shaped timelines on 1 to 4 ranks in its
own process (each rank's spans in an order of their own; rank 0 on one side of a point where
float32 rounds the times 128 s apart, the others on the other) and deals each rank only its
own, with the course's own ``bubble`` helper switched off however it is imported; it compares
every rank's answer (a Python float) there. On 2+ ranks each rank's three numbers must have
left it by collectives (CollectiveTrace sees them in every form), since no rank knows the
others' spans.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from ddp_lab.course.ch11_meshes import pipeline
from ddp_lab.course.collective_trace import CollectiveTrace
from ddp_lab.exercises.builtins_off import refused_everywhere
from ddp_lab.exercises.driver import each_world, generator, new_seed, number_problem
from ddp_lab.exercises.registry import Exercise
from ddp_lab.exercises.sealed import deal

TOLERANCE = 1e-6
FLOAT64 = ("use dtype=torch.float64: a time.time() value needs more digits than float32's 7, "
           "and the start and end round to the same number")


def pipeline_bubble(spans):
    """Reference: the earliest start (MIN), the latest end (MAX) and the busy time (SUM)
    over the ranks, in float64: time.time() needs more digits than float32 keeps."""
    first = torch.tensor([min(start for _, start, _ in spans)], dtype=torch.float64)
    last = torch.tensor([max(end for _, _, end in spans)], dtype=torch.float64)
    busy = torch.tensor([sum(end - start for _, start, end in spans)], dtype=torch.float64)
    dist.all_reduce(first, op=dist.ReduceOp.MIN)
    dist.all_reduce(last, op=dist.ReduceOp.MAX)
    dist.all_reduce(busy)
    return 1 - busy.item() / (dist.get_world_size() * (last.item() - first.item()))


def timelines(seed: int, world: int) -> list[list]:
    """Every rank's spans: two virtual stages' forwards then backwards per micro-batch,
    each rank starting and ending later than the one before (a pipeline's warm-up and
    drain), random step lengths and gaps, on a time.time()-like clock; each rank's list in
    an order of its own (a rank that records two virtual stages need not record in time
    order). Rank 0 starts just below a point where float32 rounds time.time() values up by
    128 s, the other ranks above it: a time rounded to float32 on each rank, even only as an
    origin to subtract, puts the ranks 128 s apart."""
    g = generator(seed, world)
    origin = _float32_midpoint(g) - FIRST_GAP_S
    steps = int(torch.randint(4, 9, (1,), generator=g))
    out = []
    for rank in range(world):
        t = origin + rank * _uniform(g, 0.005, 0.02)
        spans = []
        for k, kind in enumerate(["F"] * steps + ["B"] * steps):
            t += _uniform(g, 0.0, FIRST_GAP_S) if k == 0 else _uniform(g, 0.0, 0.004)
            length = _uniform(g, 0.002, 0.012)
            spans.append((f"{kind}{k % steps // 2}", t, t + length))
            t += length
        order = torch.randperm(len(spans), generator=g).tolist()
        out.append([spans[i] for i in order])
    return out


FIRST_GAP_S = 0.0045  # rank 0's first step starts within it; rank 1's after 5 ms or more


def _float32_midpoint(g: torch.Generator) -> float:
    """A time near 1.7e9 s halfway between two float32 numbers (their spacing is 128 s
    there): what lies below rounds down, what lies above rounds up."""
    spacing = 128.0
    return (round(1.7e9 / spacing) + int(torch.randint(0, 8000, (1,), generator=g))) \
        * spacing + spacing / 2


def _uniform(g: torch.Generator, low: float, high: float) -> float:
    return float(torch.empty(1, dtype=torch.float64).uniform_(low, high, generator=g))


def _dealt(seed: int, world: int):
    """Made here, in the checker's process: each rank gets its own spans only."""
    return deal(timelines(seed, world))


def _trial(fn, dealt) -> dict:
    spans = dealt.take()
    why = "measure the bubble yourself, from every rank's spans and a few collectives"
    with refused_everywhere(pipeline.bubble, "pipeline.bubble", why), CollectiveTrace() as trace:
        got, divided_by_zero = None, False
        try:
            got = fn(spans)
        except ZeroDivisionError:
            # The checker's window is never zero (every span lasts 2 ms or more): a zero
            # comes from times rounded in float32, where time.time()'s 1.7e9 s have a
            # spacing of 128 s and the first start and the last end become one number.
            divided_by_zero = True
    return {"got": got, "divided_by_zero": divided_by_zero,
            "sent": sum(c.bytes_per_rank for c in trace.moving_data())}


def _in_time_order(all_spans: list) -> float:
    """The bubble from each rank's first and last span, as if they were in time order."""
    start, end = min(spans[0][1] for spans in all_spans), max(spans[-1][2] for spans in all_spans)
    busy = sum(e - s for spans in all_spans for _, s, e in spans)
    return 1 - busy / (len(all_spans) * (end - start))


def _float32_origins(all_spans: list) -> float:
    """The bubble with each rank's times measured from its own earliest start rounded to
    float32."""
    starts, ends = [], []
    for spans in all_spans:
        origin = float(torch.tensor(min(s for _, s, _ in spans), dtype=torch.float32))
        starts.append(min(s for _, s, _ in spans) - origin)
        ends.append(max(e for _, _, e in spans) - origin)
    busy = sum(e - s for spans in all_spans for _, s, e in spans)
    return 1 - busy / (len(all_spans) * (max(ends) - min(starts)))


def _own_share(spans, window: float | None = None) -> float:
    start, end = min(s for _, s, _ in spans), max(e for _, _, e in spans)
    return 1 - sum(e - s for _, s, e in spans) / (window or end - start)


def _problem(got, all_spans: list, rank: int) -> str | None:
    want = pipeline.bubble(all_spans)
    n = len(all_spans)
    wrong_type = number_problem(got, want, "the bubble", rel=float("inf"))
    if wrong_type:
        return wrong_type
    got = float(got)
    if abs(got - want) < TOLERANCE:
        return None
    start = min(s for spans in all_spans for _, s, _ in spans)
    end = max(e for spans in all_spans for _, _, e in spans)
    busy = sum(e - s for spans in all_spans for _, s, e in spans)
    if abs(got - _in_time_order(all_spans)) < TOLERANCE:
        return ("that takes each rank's first span for its earliest start and its last span "
                "for its latest end, but a rank's spans are not in time order (two virtual "
                "stages' steps mixed): take the min of every start and the max of every end")
    if n > 1 and abs(got - _float32_origins(all_spans)) < TOLERANCE:
        return ("each rank rounded its times to float32 (or took a float32 origin of its "
                "own): here rank 0's earliest start rounds 128 s below the others', so the "
                f"ranks' clocks disagree; {FLOAT64}")
    own = [_own_share(spans) for spans in all_spans]
    if abs(got - own[rank]) < TOLERANCE:
        return ("that is this rank's own idle share: the bubble is the pipeline's, the same on "
                "every rank, from every rank's busy time, the earliest start and the latest end")
    if abs(got - sum(own) / n) < TOLERANCE:
        return ("that averages each rank's idle share over its own first-to-last span: the "
                "wait before a rank's first step and after its last (warm-up and drain) is the "
                "bubble itself, so measure every rank over the pipeline's whole window")
    if abs(got - (1 - busy / (end - start))) < TOLERANCE:
        return (f"all {n} ranks were there for the whole window: divide the busy time by "
                "world_size x (last end - first start)")
    windows = sum(max(e for _, _, e in spans) - min(s for _, s, _ in spans) for spans in all_spans)
    if abs(got - (1 - busy / windows)) < TOLERANCE:
        return ("each rank's window starts at its own first step: the idle time before a rank's "
                "first step and after its last (warm-up and drain) is the bubble itself; use "
                "the earliest start and the latest end over all ranks (ReduceOp.MIN, MAX)")
    return (f"got {got:.6f}, expected {want:.6f} (1 - busy / (world_size x window)); "
            f"if the times went into tensors, {FLOAT64}")


def _traffic_problem(sent: float, n: int) -> str | None:
    """No rank knows the others' spans: its three numbers (earliest start, latest end, busy
    time) must leave it, at least once each, as float32 or wider: (n-1)/n of 12 bytes in the
    cheapest collective that carries them."""
    least = (n - 1) / n * 12
    if sent >= 0.99 * least:
        return None
    return (f"the right number, but only {sent:.0f} bytes left this rank by the collectives, "
            f"where its earliest start, latest end and busy time take {least:.0f} or more "
            "((n-1)/n of 12 bytes, in a ring's accounting): no rank knows the others' spans, "
            "so combine them with collectives called from your function")


def check_interleaved_bubble(fn) -> str:
    seed = new_seed()

    def judge(value: dict, rank: int, n: int) -> str | None:
        if value["divided_by_zero"]:
            return ("ZeroDivisionError: the window (last end - first start) came out 0, but "
                    f"no window here is 0; {FLOAT64}")
        problem = _problem(value["got"], timelines(seed, n), rank)
        if not problem and n > 1:
            problem = _traffic_problem(value["sent"], n)
        return problem

    each_world(_trial, lambda n: (fn, _dealt(seed, n)), judge, seed,
               hang_hint="Every rank must make the same collectives, in the same order.")
    return f"every rank measured the pipeline's bubble on 1 to 4 ranks (seed {seed})"


EXERCISES = (
    Exercise(
        name="11b.interleaved_bubble", notebook="11b_pipelining_in_practice",
        summary="pipeline_bubble(spans): the pipeline's idle share from every rank's own spans",
        hint="Three numbers over all ranks decide it: the earliest start, the latest end and "
             "the total busy time; each needs its own kind of reduction. Put them in float64 "
             "tensors (a time.time() value needs more digits than float32 keeps) and return "
             "a Python float.",
        recipe="1. On each rank: start = min of the span starts, end = max of the ends, busy = "
               "sum of (end - start) over the spans.\n2. Put each in a one-element tensor with "
               "dtype=torch.float64.\n3. dist.all_reduce(start_t, op=dist.ReduceOp.MIN); "
               "dist.all_reduce(end_t, op=dist.ReduceOp.MAX); dist.all_reduce(busy_t) (SUM)."
               "\n4. return 1 - busy_t.item() / (dist.get_world_size() * (end_t.item() - "
               "start_t.item())).",
        solution=pipeline_bubble, checker=check_interleaved_bubble,
        answered_by=("ddp_lab.course.ch11_meshes.pipeline:bubble",)),
)
