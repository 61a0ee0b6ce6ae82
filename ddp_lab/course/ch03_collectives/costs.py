"""Notebook 03's measurements and pitfalls: what collectives cost, and how they go wrong.

``collectives`` shows what each collective computes; this module times them and breaks them
on purpose: object collectives against tensors, one all_gather instead of 100 (the cat/chunk
trick), async_op overlap, when a barrier lets ranks go, the in-place overwrite, and
mismatched shapes, which give an error, wrong data, a crash or a hang depending on the
collective. Timings are medians after a warm-up, each run started at a barrier.
"""

from __future__ import annotations

import pickle
import statistics
import time

import torch
import torch.distributed as dist

from ddp_lab.course.ch03_collectives.collectives import ROOT, rank_values
from ddp_lab.course.collective_trace import CollectiveTrace
from ddp_lab.launch.errors import short_message


# --- objects, lists of tensors, async handles, barrier -----------------------------------------

def object_collectives() -> dict:
    """Any picklable object, of a different size on every rank: what tensors cannot do."""
    rank, world = dist.get_rank(), dist.get_world_size()
    mine = {"rank": rank, "words": ["tok"] * (rank + 1)}
    everyone = [None] * world
    dist.all_gather_object(everyone, mine)
    config = [{"lr": 0.1, "seed": 1234}] if rank == ROOT else [None]
    dist.broadcast_object_list(config, src=ROOT)
    at_root = [None] * world if rank == ROOT else None
    dist.gather_object(f"rank {rank} done", at_root, dst=ROOT)
    return {"all_gather_object": everyone, "broadcast_object_list": config[0],
            "gather_object": at_root}


def _median_seconds(fn, repeats: int) -> float:
    """Median wall time of fn() after one warm-up; a barrier first, so ranks start together."""
    times = []
    for _ in range(repeats + 1):
        dist.barrier()
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times[1:])


def object_vs_tensor_cost(numel: int = 10_000, repeats: int = 10) -> dict:
    """Seconds per call for the same numbers as a tensor and as a Python object."""
    return {name: _median_seconds(fn, repeats) for name, fn in _object_cases(numel).items()}


def object_vs_tensor_traffic(numel: int = 10_000) -> dict:
    """What each case sends, whatever the machine: {case: (all-gathers, bytes)}. An object
    collective pickles, then all-gathers the sizes and then the padded bytes
    (``all_gather_object``, torch/distributed/distributed_c10d.py)."""
    found = {}
    for name, fn in _object_cases(numel).items():
        with CollectiveTrace() as trace:
            fn()
        gathers = trace.of("all_gather")
        found[name] = (len(gathers), sum(call.whole_nbytes for call in gathers))
    return found


def _object_cases(numel: int) -> dict:
    world = dist.get_world_size()
    data = torch.randn(numel)
    as_list = data.tolist()
    out = [torch.empty_like(data) for _ in range(world)]
    cases = {
        "all_gather(tensor)": lambda: dist.all_gather(out, data),
        "all_gather_object(same tensor)": lambda: dist.all_gather_object([None] * world, data),
        "all_gather_object(list of floats)": lambda: dist.all_gather_object([None] * world,
                                                                            as_list),
        "pickle.dumps + loads only": lambda: pickle.loads(pickle.dumps(as_list)),
    }
    return cases


def cat_all_gather(tensors: list) -> list:
    """The cat/chunk trick: all_gather a list of tensors with ONE collective. Flatten and
    concatenate, all_gather the one tensor, split it back. Result[rank][i] is that rank's
    i-th tensor. Every rank must pass the same shapes, as all_gather needs equal sizes."""
    flat = torch.cat([t.reshape(-1) for t in tensors])
    gathered = [torch.empty_like(flat) for _ in range(dist.get_world_size())]
    dist.all_gather(gathered, flat)
    sizes = [t.numel() for t in tensors]
    return [[p.view_as(t) for p, t in zip(g.split(sizes), tensors)] for g in gathered]


def all_gather_each(tensors: list) -> list:
    """The same result with one all_gather per tensor: len(tensors) collectives."""
    world = dist.get_world_size()
    per_tensor = []
    for t in tensors:
        out = [torch.empty_like(t) for _ in range(world)]
        dist.all_gather(out, t)
        per_tensor.append(out)
    return [list(from_rank) for from_rank in zip(*per_tensor)]


def list_gather_cost(count: int = 100, numel: int = 16, repeats: int = 5) -> dict:
    """Seconds for ``count`` small tensors: one all_gather each vs cat_all_gather, and
    whether both gave the same tensors."""
    rank = dist.get_rank()
    tensors = [torch.full((numel,), 1000.0 * rank + i) for i in range(count)]
    same = all(torch.equal(a, b) for mine, theirs in zip(cat_all_gather(tensors),
                                                          all_gather_each(tensors))
               for a, b in zip(mine, theirs))
    seconds = {f"{count} x all_gather": _median_seconds(lambda: all_gather_each(tensors), repeats),
               "cat + 1 all_gather + split": _median_seconds(lambda: cat_all_gather(tensors),
                                                             repeats)}
    return {"same_result": same, "seconds": seconds}


def overlapped(x: torch.Tensor, compute) -> None:
    work = dist.all_reduce(x, async_op=True)  # returns at once; x is not reduced yet
    compute()  # this rank's own work, while gloo's thread moves the data
    work.wait()  # from here on x holds the sum


def async_overlap(numel: int = 4_000_000, compute_s: float = 0.02, repeats: int = 5) -> dict:
    """Seconds for an all_reduce and some compute, one after the other vs overlapped with
    async_op=True. Two kinds of compute: sleep stands for work done elsewhere (a GPU
    kernel), matmul needs the same CPU cores as gloo's communication thread."""
    x, a = torch.ones(numel), torch.randn(256, 256)
    one = _median_seconds(lambda: a @ a, 3)
    reps = max(1, round(compute_s / one))
    computes = {"sleep": lambda: time.sleep(compute_s),
                "matmul": lambda: [a @ a for _ in range(reps)]}
    times = {"all_reduce alone": _median_seconds(lambda: dist.all_reduce(x), repeats)}
    for kind, compute in computes.items():
        times[f"{kind} alone"] = _median_seconds(compute, repeats)
        times[f"{kind}, then all_reduce"] = _median_seconds(
            lambda: (compute(), dist.all_reduce(x)), repeats)  # noqa: B023 - called at once
        times[f"{kind} during all_reduce (async_op)"] = _median_seconds(
            lambda: overlapped(x, compute), repeats)  # noqa: B023
    return times


def barrier_release(step_s: float = 0.1) -> dict:
    """Rank r arrives r * step_s late; nobody leaves before the last one arrives.
    time.monotonic is one clock for every process on a Linux machine."""
    dist.barrier()
    time.sleep(step_s * dist.get_rank())
    arrived = time.monotonic()
    dist.barrier()
    return {"arrived": arrived, "left": time.monotonic()}


# --- practice: in place, mismatched shapes --------------------------------------------------

def in_place() -> dict:
    """all_reduce returns None and overwrites its input: keep a clone if you need it."""
    t = rank_values(dist.get_rank(), 3)
    kept = t.clone()
    returned = dist.all_reduce(t)
    return {"returned": returned, "input_after": t, "clone_before": kept}


def mismatched(case: str, debug_detail: bool = False) -> list:
    """A shape bug on purpose: rank r passes a tensor of 2 + r elements. Or, in the case
    ``"all_reduce, float32 vs int32"``, a dtype bug: the same 4 elements, float32 on rank 0
    and int32 elsewhere (the same element size, so nothing compares them)."""
    rank, world = dist.get_rank(), dist.get_world_size()
    group = None
    if debug_detail:
        # What TORCH_DISTRIBUTED_DEBUG=DETAIL does when set before torch is imported: groups
        # made afterwards compare every call's shapes across ranks before running it.
        dist.set_debug_level(dist.DebugLevel.DETAIL)
        group = dist.new_group(backend="gloo")
    t = torch.arange(2.0 + rank) + 10 * rank
    if case == "all_reduce, float32 vs int32":
        t = torch.arange(1, 5, dtype=torch.float32 if rank == 0 else torch.int32)
        dist.all_reduce(t, group=group)  # the sum of [1, 2, 3, 4] from 2 ranks is [2, 4, 6, 8]
    elif case == "all_gather":
        dist.all_gather([torch.zeros(2) for _ in range(world)], t, group=group)
    elif case.startswith("broadcast"):
        dist.broadcast(t, src=0 if case == "broadcast from rank 0" else world - 1, group=group)
    else:
        dist.all_reduce(t, group=group)
        time.sleep(60)  # a rank that got through goes on with its work, as real code would
    return t.tolist()


MISMATCH_CASES = ("all_gather", "broadcast from rank 0", "broadcast from the last rank",
                  "all_reduce", "all_reduce, float32 vs int32")


def detail_check_calls() -> dict[str, list[str]]:
    """The gloo operations one ``all_reduce`` runs on this rank, as torch's profiler records
    them, in a group made under ``DebugLevel.DETAIL`` and in a plain one. DETAIL wraps the
    group (``ProcessGroupWrapper::runCollectiveChecks``): before the collective, a monitored
    barrier on a helper gloo group (rank 0 receives from and answers every other rank) and
    two all-gathers (the fingerprint's size, then the fingerprint)."""
    from torch.profiler import ProfilerActivity, profile
    dist.set_debug_level(dist.DebugLevel.DETAIL)
    checked = dist.new_group(backend="gloo")
    dist.set_debug_level(dist.DebugLevel.OFF)
    plain = dist.new_group(backend="gloo")
    calls = {}
    for name, group in (("DETAIL", checked), ("plain", plain)):
        dist.all_reduce(torch.ones(4), group=group)  # the first call also connects: not timed
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            dist.all_reduce(torch.ones(4), group=group)
        calls[name] = sorted(e.name for e in prof.events() if e.name.startswith("gloo:"))
    return calls


def try_mismatches(world_size: int = 2, timeout: float = 3.0) -> dict:
    """Run each mismatched case (and all_reduce once more under DETAIL checks); return
    case -> (outcome, detail), with a short timeout so a hang costs seconds."""
    import ddp_lab
    runs = [(case, (case, False)) for case in MISMATCH_CASES]
    runs.append(("all_reduce, DETAIL debug", ("all_reduce", True)))
    outcomes = {}
    for label, args in runs:
        try:
            res = ddp_lab.run(mismatched, world_size, args=args, timeout=timeout, echo=False)
            outcomes[label] = ("no error", f"ranks returned {res.values}")
        except ddp_lab.WorkerTimeout as err:
            waiting = [r for r, stack in sorted(err.stacks.items()) if "wait" in stack]
            outcomes[label] = ("hang", f"after {timeout:g} s ranks {waiting} still wait inside "
                                       "the collective; the others went on")
        except ddp_lab.WorkerError as err:
            kind = "crash" if (err.exitcode or 0) < 0 else "error"
            outcomes[label] = (kind, _error_line(err))
    return outcomes


def _error_line(err) -> str:
    """The line that says what went wrong: a Python error, or gloo's abort message."""
    lines = [ln for ln in err.logs[err.rank].splitlines() + err.traceback.splitlines()
             if "Error" in ln or "what()" in ln]
    line = lines[-1].split("what():")[-1].strip() if lines else err.traceback
    if "differ in the following aspects:" in line:  # DETAIL's message: keep the verdict
        line = "Detected mismatch between collectives: " + line.split("aspects:")[-1].strip()
    return short_message(line, 160)
