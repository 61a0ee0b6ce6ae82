"""Notebook 11b: each rank's recorded order of pipeline steps replayed on a perfect machine
(ideal step costs, free messages), so that the bubble of what the schedule did can be
compared exactly with the formulas, apart from the overheads that the measured one has."""

from __future__ import annotations

from ddp_lab.course.ch11_meshes.pipeline import bubble, expected_bubble
from ddp_lab.course.ch11_meshes.pipe_model import PipeliningConfig
from ddp_lab.course.ch11_meshes.pipelining import SCHEDULES

COST = {"F": 1.0, "I": 1.0, "W": 1.0, "B": 2.0}   # a stage holding all of a rank's layers


def replay(result: list[dict], virtual: int) -> list[list]:
    """Each rank's recorded order of steps replayed with ideal costs (``COST``, divided by
    the stages per rank) and free messages: a step starts once its rank is free and its
    inputs exist (F after the previous stage's F; B or I after the next stage's B or I and
    its own F; W after its I). The per-rank spans, in cost units, of a perfect machine."""
    todo = [sorted(zip(r["spans"], r["stage_of_span"]), key=lambda s: s[0][1]) for r in result]
    last = max(stage for r in result for stage in r["stage_of_span"])
    done, free, spans = {}, [0.0] * len(todo), [[] for _ in todo]
    while any(todo):
        progressed = False
        for rank, steps in enumerate(todo):
            while steps:
                (label, _, _), stage = steps[0]
                ready = _ready(label[0], int(label[1:]), stage, last, done)
                if ready is None:
                    break
                start = max(free[rank], ready)
                free[rank] = start + COST[label[0]] / virtual
                done[(label[0], int(label[1:]), stage)] = free[rank]
                spans[rank].append((label, start, free[rank]))
                steps.pop(0)
                progressed = True
        if not progressed:
            raise RuntimeError("the recorded orders wait on each other: no step can start")
    return spans


def _ready(kind: str, mb: int, stage: int, last: int, done: dict):
    """When step (kind, mb) of ``stage`` may start, or None while an input is missing."""
    needs = {"F": [("F", stage - 1)] if stage > 0 else [],
             "W": [("I", stage)]}.get(kind)
    if needs is None:  # B or I: its own forward, and the gradient from the next stage
        needs = [("F", stage)] + ([("B", stage + 1), ("I", stage + 1)] if stage < last else [])
        found = [done[(k, mb, s)] for k, s in needs[1:] if (k, mb, s) in done]
        if (("F", mb, stage) not in done) or (stage < last and not found):
            return None
        return max([done[("F", mb, stage)]] + found)
    times = [done.get((k, mb, s)) for k, s in needs]
    return None if None in times else max(times, default=0.0)


def torch_zbv_orders(p: int, m: int) -> list[dict]:
    """Each rank's order of steps in torch's own ZBV plan for ``p`` ranks and ``m``
    micro-batches, in the shape ``replay`` reads. The planner pads the plan to
    max(2p - 1, m) micro-batches and then drops the padding (T/distributed/pipelining/
    schedules.py, ``ScheduleZBVZeroBubble._calculate_single_rank_operations``); it reads only
    p, m and the stage count, so no process group is needed."""
    import types

    from torch.distributed.pipelining.schedules import ScheduleZBVZeroBubble
    plan = types.SimpleNamespace(pp_group_size=p, _n_microbatches=m, num_stages=2 * p)
    out = []
    for rank in range(p):
        ops = [a for a in ScheduleZBVZeroBubble._calculate_single_rank_operations(plan, rank)
               if a is not None]
        out.append({"spans": [(f"{a.computation_type.value}{a.microbatch_index}", i, i + 1)
                              for i, a in enumerate(ops)],
                    "stage_of_span": [a.stage_index for a in ops]})
    return out


def zbv_formula(p: int, m: int) -> float:
    """ZBV's replayed bubble for m >= 2p - 1 (and for some smaller m, not for m = p):
    (p-1)/(6m+p-1)."""
    return (p - 1) / (6 * m + p - 1)


def bubble_rows(results: list[dict], config: PipeliningConfig = PipeliningConfig()) -> list[dict]:
    """Per library schedule: the bubble measured on the ranks' clocks, the bubble of its
    recorded orders replayed with ideal costs, and (p-1)/(v*m+p-1) for the schedules
    that formula describes (v = 1 for GPipe and 1F1B)."""
    p, rows = len(results), []
    for s in SCHEDULES:
        per_rank = [r[s.name] for r in results]
        rows.append({"name": s.name, "measured": bubble([r["spans"] for r in per_rank]),
                     "replayed": bubble(replay(per_rank, s.virtual)),
                     "formula": None if s.v_shape else expected_bubble(p, s.virtual * config.microbatches)})
    return rows
