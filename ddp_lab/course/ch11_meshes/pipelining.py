"""Pipelining in practice (notebook 11b): the model of ``pipe_model`` cut into stages and
trained one step by ``torch.distributed.pipelining``'s schedules (GPipe, 1F1B, interleaved
1F1B, zero bubble), each rank's real timeline recorded by the stages themselves.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed import pipelining as pp

from ddp_lab.course.ch11_meshes.pipe_model import PipeliningConfig, batch, cut, make_layers
from ddp_lab.course.collective_trace import CollectiveTrace


@dataclass(frozen=True)
class Schedule:
    name: str
    cls: type
    virtual: int = 1             # stages per rank
    v_shape: bool = False        # rank r holds stages r and 2p-1-r (else r, r+p, ...)


SCHEDULES = (
    Schedule("GPipe", pp.ScheduleGPipe),
    Schedule("1F1B", pp.Schedule1F1B),
    Schedule("Interleaved 1F1B", pp.ScheduleInterleaved1F1B, virtual=2),
    Schedule("ZBV zero bubble", pp.ScheduleZBVZeroBubble, virtual=2, v_shape=True),
)


def stages_of(schedule: Schedule, rank: int, ranks: int) -> list[int]:
    """The stage indices rank ``rank`` holds: looped (r, r + p, ...) or V-shaped."""
    if schedule.v_shape:
        return [rank, 2 * ranks - 1 - rank]
    return [rank + k * ranks for k in range(schedule.virtual)]


class TimedStage(pp.PipelineStage):
    """A ``PipelineStage`` that records when it ran each forward (F), full backward (B),
    input-gradient backward (I) and weight-gradient backward (W), as
    ``(label, start, end, stage)`` in ``spans``: what the schedule made this rank do."""

    def __init__(self, *args, spans: list, **kwargs):
        super().__init__(*args, **kwargs)
        self.spans = spans

    def _timed(self, kind: str, chunk: int, run):
        start = time.time()
        out = run()
        self.spans.append((f"{kind}{chunk}", start, time.time(), self.stage_index))
        return out

    def forward_one_chunk(self, fwd_chunk_id, *args, **kwargs):
        return self._timed("F", fwd_chunk_id,
                           lambda: super(TimedStage, self).forward_one_chunk(fwd_chunk_id, *args, **kwargs))

    def backward_one_chunk(self, bwd_chunk_id, loss=None, full_backward=True, last_backward=False):
        return self._timed("B" if full_backward else "I", bwd_chunk_id,
                           lambda: super(TimedStage, self).backward_one_chunk(
                               bwd_chunk_id, loss=loss, full_backward=full_backward,
                               last_backward=last_backward))

    def backward_weight_one_chunk(self, bwd_chunk_id, last_backward=False):
        return self._timed("W", bwd_chunk_id,
                           lambda: super(TimedStage, self).backward_weight_one_chunk(
                               bwd_chunk_id, last_backward=last_backward))


def run_schedule(schedule: Schedule, config: PipeliningConfig) -> dict:
    """On each rank: one training step (after a warm-up step) of ``schedule``; this rank's
    spans, its stages' gradients (layer by layer) and, where it holds the last stage, the
    micro-batches' losses, and the point-to-point messages it issued during that step
    (``p2p``: counted by ``CollectiveTrace``, which sees each ``isend``/``irecv`` the
    schedule issues, directly or through ``batch_isend_irecv``, as a ``c10d::send`` /
    ``c10d::recv_``)."""
    rank, ranks = dist.get_rank(), dist.get_world_size()
    n_stages = ranks * schedule.virtual
    modules = cut(make_layers(config, ranks), n_stages)
    mine, spans = stages_of(schedule, rank, ranks), []
    stages = [TimedStage(modules[i], i, n_stages, torch.device("cpu"), spans=spans) for i in mine]
    step = schedule.cls(stages if schedule.virtual > 1 else stages[0],
                        n_microbatches=config.microbatches, loss_fn=F.mse_loss)
    x, y = batch(config)
    args = (x,) if 0 in mine else ()
    target = y if n_stages - 1 in mine else None
    step.step(*args, target=target)              # first call: shapes, buffers, p2p set-up
    for i in mine:
        modules[i].zero_grad()
    spans.clear()
    dist.barrier()
    losses = []
    with CollectiveTrace() as trace:
        step.step(*args, target=target, losses=losses)
    return {"spans": [s[:3] for s in spans], "stage_of_span": [s[3] for s in spans],
            "stages": mine, "losses": [l.item() for l in losses], "p2p": p2p_of(trace),
            "grads": {i: [[p.grad.clone() for p in layer.parameters()] for layer in modules[i]]
                      for i in mine}}


def all_schedules(config: PipeliningConfig = PipeliningConfig()) -> dict:
    """Every schedule of SCHEDULES, one after the other on the same ranks, and what torch's
    constructors say to a number of micro-batches they refuse (``m_refused``)."""
    return {**{s.name: run_schedule(s, config) for s in SCHEDULES}, "m_refused": m_refused(config)}


def p2p_of(trace: CollectiveTrace) -> dict:
    """A step's point-to-point traffic on this rank: messages sent and received, their
    bytes, and the ranks they went to or came from. Anything else the step issued (there
    is nothing else in a step after the first) is listed under ``other``."""
    sends, recvs = trace.of("send"), trace.of("recv")
    return {"sends": len(sends), "recvs": len(recvs),
            "sent_bytes": sum(c.nbytes for c in sends), "received_bytes": sum(c.nbytes for c in recvs),
            "peers": sorted({c.peer for c in sends + recvs}),
            "other": [c.name for c in trace.calls if c.family not in ("send", "recv")]}


def p2p_expected(schedule: Schedule, rank: int, ranks: int, microbatches: int) -> int:
    """The messages rank ``rank`` sends in one step (and receives: as many), from where the
    stages sit: each of its stages sends every micro-batch's activation to the next stage
    and its input gradient to the previous one, unless that stage is on the same rank (the
    V's turn, stages p-1 and p on rank p-1: passed by a function call,
    ``set_local_fwd_input`` / ``set_local_bwd_input``, T/distributed/pipelining/stage.py
    "[Note: V-schedule special case]", and schedules.py:2540, :2569, :2591)."""
    n_stages, mine = ranks * schedule.virtual, stages_of(schedule, rank, ranks)
    where = {i: r for r in range(ranks) for i in stages_of(schedule, r, ranks)}
    crossings = sum(1 for i in mine for j in (i - 1, i + 1) if 0 <= j < n_stages and where[j] != rank)
    return crossings * microbatches


def m_refused(config: PipeliningConfig) -> dict:
    """torch's own checks on m, from the constructors (no step runs): 1F1B with m = p - 1
    (it needs m >= its stages) and interleaved 1F1B with m = 2p + 1 (it needs m to be a
    multiple of its rounds, max(1, m // p)). Schedule name -> (m, torch's ValueError)."""
    ranks, out = dist.get_world_size(), {}
    for schedule, m in ((SCHEDULES[1], ranks - 1), (SCHEDULES[2], 2 * ranks + 1)):
        n_stages = ranks * schedule.virtual
        modules = cut(make_layers(config, ranks), n_stages)
        stages = [pp.PipelineStage(modules[i], i, n_stages, torch.device("cpu"))
                  for i in stages_of(schedule, dist.get_rank(), ranks)]
        try:
            schedule.cls(stages if schedule.virtual > 1 else stages[0], n_microbatches=m,
                         loss_fn=F.mse_loss)
            out[schedule.name] = (m, None)
        except ValueError as err:
            out[schedule.name] = (m, str(err))
    return out


def peak_in_flight(result: dict) -> int:
    """The most micro-batches whose forward this rank's stages held at once, counted from
    the recorded order over the rank's stages: from F until B, or with a split backward
    until W. F keeps the forward's outputs (``fwd_cache[chunk] = ...``,
    T/distributed/pipelining/stage.py ``forward_one_chunk``); I pops them but then stores
    ``backward_state[chunk] = (input_values, param_groups, stage_output, output_grads)``
    (stage.py:1031-1036) after an ``autograd.grad(..., retain_graph=True)``
    (_backward.py:250), so every activation the weight gradients need stays alive until W
    pops that state (stage.py:1078-1083). I frees only the output side of the graph."""
    held = peak = 0
    for label in order(result["spans"]):
        held += 1 if label[0] == "F" else -1 if label[0] in "BW" else 0
        peak = max(peak, held)
    return peak


def order(spans: list) -> list[str]:
    """The labels of a rank's spans in the order they started."""
    return [label for label, _, _ in sorted(spans, key=lambda s: s[1])]


def split_backward(config: PipeliningConfig = PipeliningConfig()) -> dict:
    """One stage in one process, backward done the zero-bubble way with the pipelining
    library's own two halves: input gradients first (what the previous stage waits for),
    weight gradients later; timed, and compared with one full backward."""
    from torch.distributed.pipelining._backward import stage_backward_input, stage_backward_weight
    stage = cut(make_layers(config, 1), 1)[0]
    x = batch(config)[0][:config.microbatch_rows].clone().requires_grad_()
    out = stage(x)
    grad_out = torch.ones_like(out) / out.numel()
    t0 = time.time()
    dinputs, groups = stage_backward_input([out], [grad_out], [x], stage.parameters())
    t1 = time.time()
    after_input = [p.grad for p in stage.parameters()]
    stage_backward_weight(stage.parameters(), groups)
    t2 = time.time()
    split = [p.grad.clone() for p in stage.parameters()]
    stage.zero_grad()
    x2 = x.detach().clone().requires_grad_()
    t3 = time.time()
    stage(x2).backward(grad_out)
    t4 = time.time()
    return {"input_grad_s": t1 - t0, "weight_grad_s": t2 - t1, "full_s": t4 - t3,
            "weights_after_input": after_input, "x_grad_split": dinputs[0],
            "x_grad_full": x2.grad, "weight_grads_split": split,
            "weight_grads_full": [p.grad for p in stage.parameters()]}

