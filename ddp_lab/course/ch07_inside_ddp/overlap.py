"""Communication overlapping backward computation, made visible (notebook 07).

During ``loss.backward()`` autograd computes the gradients layer by layer, last layer
first. DDP's Reducer launches the all-reduce of a bucket (asynchronously, on the process
group's own thread) the moment its last gradient is ready, so the network works on the
late layers' gradients while autograd still computes the early layers'. Without DDP the
obvious way is to wait for the whole backward, then all-reduce: nothing overlaps.

``step_timeline`` records training steps both ways on every rank: per layer, when its
backward started and ended (``LayerClock``); per bucket, when the Reducer handed it over
(``BucketRecorder``), and when gloo really ran its all-reduce: the ``gloo:all_reduce``
span that ``torch.profiler`` records on the process group's worker thread. ProcessGroupGloo
runs its work queue on 2 threads by default (``ProcessGroupGloo::Options::threads``), so two
buckets can be on the wire at once.
"""

from __future__ import annotations

import time

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.profiler import ProfilerActivity, profile

from ddp_lab.course.ch07_inside_ddp.steps import all_reduce_after_backward
from ddp_lab.course.ch07_inside_ddp.workload import BucketRecorder
from ddp_lab.course.models import MLPConfig, make_mlp
from ddp_lab.course.trace_events import collective_spans, most_in_flight, spans_of

TIMELINE_MODEL = MLPConfig(inputs=1024, width=1024, depth=6, outputs=1024)


class LayerClock:
    """Per Linear layer: when backward reached it (its output's gradient arrived) and when
    it was done (its parameters' gradients accumulated, which happens after the layer's
    backward node has computed both its input's and its weight's gradient)."""

    def __init__(self, model: nn.Module):
        self.spans: dict[str, list[float]] = {}
        for name, module in model.named_modules():
            if isinstance(module, nn.Linear):
                module.register_forward_hook(lambda _m, _i, out, n=name: self._watch(out, n))
                for p in module.parameters():
                    p.register_post_accumulate_grad_hook(lambda _p, n=name: self._end(n))

    def _watch(self, output: torch.Tensor, name: str) -> None:
        """Backward reaches the layer when its output's gradient is complete: a tensor
        hook (module backward hooks would also work, but warn for the first layer)."""
        if output.requires_grad:
            output.register_hook(lambda _grad: self._start(name))

    def _start(self, name: str) -> None:
        self.spans[name] = [time.time(), time.time()]

    def _end(self, name: str) -> None:
        self.spans[name][1] = max(self.spans[name][1], time.time())

    def as_spans(self) -> list[tuple[str, float, float]]:
        return [(f"backward {name}", start, end) for name, (start, end) in self.spans.items()]


def _ddp_stepper(config: MLPConfig, cap_mb):
    """A function that runs one DDP step and returns its spans on this rank."""
    model = make_mlp(config)
    ddp = DDP(model, bucket_cap_mb=cap_mb)
    recorder, clock = BucketRecorder(model).register(ddp), LayerClock(model)

    def step(x, iteration: int) -> dict:
        recorder.iteration = iteration
        start = time.time()
        loss = ddp(x).square().mean()
        forward_end = time.time()
        loss.backward()  # returns once DDP has waited for every bucket
        handed = sorted(recorder.of_iteration(iteration), key=lambda r: r["index"])
        return {"compute": [("forward", start, forward_end)] + clock.as_spans(),
                "comm": [(f"bucket {r['index']}", r["ready"], r["done"]) for r in handed],
                "step": (start, time.time())}
    return step


def _manual_stepper(config: MLPConfig):
    """The same for backward first, then ``all_reduce_after_backward``."""
    model = make_mlp(config)
    clock, flat = LayerClock(model), [None]

    def step(x, iteration: int) -> dict:
        start = time.time()
        loss = model(x).square().mean()
        forward_end = time.time()
        loss.backward()
        sync_start = time.time()
        flat[0] = all_reduce_after_backward(model, flat[0])
        return {"compute": [("forward", start, forward_end)] + clock.as_spans(),
                "comm": [("all gradients", sync_start, time.time())],
                "step": (start, time.time())}
    return step


def step_timeline(config: MLPConfig = TIMELINE_MODEL, cap_mb=4, batch: int = 64,
                  warmup: int = 2, repeats: int = 3) -> dict:
    """On each rank: one step's spans ``(label, start, end)`` (time.time()), for DDP with
    ``bucket_cap_mb=cap_mb`` ("ddp") and for all-reduce after backward ("no_overlap").
    Each step's "comm" spans are gloo's real runs of its all-reduces, "handed" the times
    the work was handed to the process group, "threads" which gloo thread ran each.

    The two take turns for ``warmup`` steps (which also rebuild DDP's buckets), then
    ``repeats`` more; of those, each keeps its median step (by the slowest rank's
    duration, the same step on every rank), so one burst of outside load does not
    decide the picture."""
    torch.manual_seed(dist.get_rank())
    x = torch.randn(batch, config.inputs)
    steppers = {"ddp": _ddp_stepper(config, cap_mb), "no_overlap": _manual_stepper(config)}
    kept = {key: [] for key in steppers}
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for iteration in range(warmup + repeats):
            for key, step in steppers.items():
                dist.barrier()
                spans = step(x, iteration)
                if iteration >= warmup:
                    kept[key].append(spans)
    trace = collective_spans(spans_of(prof))
    chosen = {key: _with_real_runs(_median_step(steps), trace) for key, steps in kept.items()}
    chosen["gloo_threads"] = dist.group.WORLD._get_backend(torch.device("cpu")).options._threads
    return chosen


def _with_real_runs(step: dict, trace: list) -> dict:
    """Replace each all-reduce's (handed over, done) by gloo's real run of it. Work leaves
    the queue in the order it was handed over, so the k-th run that started during the
    step belongs to the k-th bucket."""
    runs = collective_spans(trace, within=step["step"])
    if len(runs) != len(step["comm"]):
        raise RuntimeError(f"the profiler saw {len(runs)} gloo all-reduces in a step that "
                           f"handed over {len(step['comm'])}; is something else all-reducing?")
    return {**step, "handed": [handed for _, handed, _ in step["comm"]],
            "comm": [(label, run.start, run.end) for (label, _, _), run in zip(step["comm"], runs)],
            "threads": [run.thread for run in runs]}


def in_flight(step: dict) -> int:
    """The most all-reduces that gloo was running at one moment during the step."""
    return most_in_flight([(start, end) for _, start, end in step["comm"]])


def _median_step(steps: list[dict]) -> dict:
    durations = torch.tensor([s["step"][1] - s["step"][0] for s in steps], dtype=torch.float64)
    dist.all_reduce(durations, op=dist.ReduceOp.MAX)
    return steps[int(durations.argsort()[len(steps) // 2])]


def overlap_fraction(step: dict) -> float:
    """Share of the buckets' time on the wire (gloo's real run of each all-reduce) that lay
    before the end of backward: how much communication backward hid."""
    compute = [(s, e) for label, s, e in step["compute"] if label != "forward"]
    backward_end = max(e for _, e in compute)
    comm = [(s, e) for _, s, e in step["comm"]]
    total = sum(e - s for s, e in comm)
    hidden = sum(max(0.0, min(e, backward_end) - s) for s, e in comm)
    return hidden / total if total else 0.0


def overlap_summary() -> dict:
    """``ddp-lab run overlap``: this rank's step time and hidden share of communication,
    with DDP and with all-reduce after backward."""
    timeline = step_timeline()
    return {key: {"ms": round(1e3 * (s["step"][1] - s["step"][0]), 1),
                  "overlap": round(overlap_fraction(s), 2), "in_flight": in_flight(s)}
            for key, s in ((k, timeline[k]) for k in ("ddp", "no_overlap"))}
