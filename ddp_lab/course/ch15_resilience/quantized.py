"""An int8 all-reduce with error feedback, from scratch (notebook 15), next to the same
all-reduce without it (notebook 07's int8 hook) and torch's PowerSGD hook (notebook 07).

Rounding a gradient to a grid loses what falls between grid points. Without memory that
loss is gone for good: an entry smaller than half a grid step is sent as 0 at every step and
never moves its parameter. Error feedback (Seide et al. 2014, "1-bit SGD"; Karimireddy et
al. 2019, https://arxiv.org/abs/1901.09847) keeps what rounding removed on each rank and
adds it to the next step's tensor, so over many steps everything gets through: the sum of
what was sent differs from the sum of the true values by one step's rounding at most.
PowerSGD (torch's ``powerSGD_hook``) keeps such an error buffer too
(``use_error_feedback=True`` by default, torch/distributed/algorithms/ddp_comm_hooks/
powerSGD_hook.py).
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook
from torch.nn.parallel import DistributedDataParallel as DDP

from ddp_lab.course.collective_trace import CollectiveTrace

from ddp_lab.course.ch15_resilience.workload import rank_slice, regression_data
from ddp_lab.course.models import MLPConfig, make_mlp

MODEL = MLPConfig(inputs=64, width=256, depth=3, outputs=8)  # notebook 07's HOOK_MODEL


def int8_all_reduce(tensor: torch.Tensor, error: torch.Tensor | None = None) -> torch.Tensor:
    """The mean over the ranks of ``tensor``, sent as one byte per entry.

    The ranks agree on a scale (all-reduce MAX of one number) and round to a grid of
    ``127 // world`` levels each side, so the SUM of ``world`` int8 tensors cannot overflow.
    With ``error`` (this rank's memory, same shape), what is sent is ``tensor + error`` and
    ``error`` keeps what the rounding removed."""
    world = dist.get_world_size()
    compensated = tensor if error is None else tensor + error
    scale = compensated.abs().max().reshape(1).clamp_min(torch.finfo(tensor.dtype).tiny)
    dist.all_reduce(scale, op=dist.ReduceOp.MAX)
    levels = 127 // world
    quantized = (compensated / scale * levels).round().to(torch.int8)
    if error is not None:
        error.copy_(compensated - quantized.to(tensor.dtype) * scale / levels)
    dist.all_reduce(quantized)
    return quantized.to(tensor.dtype) * scale / (levels * world)


def small_entries_survive(steps: int = 50, size: int = 1000) -> dict:
    """The same tensor all-reduced ``steps`` times: one large entry and many below half a
    grid step (the same on every rank, so their true mean is themselves). Per entry, the mean
    of what arrived over the steps, with and without error feedback."""
    torch.manual_seed(0)
    tensor = torch.rand(size) * 0.002 + 0.001   # 0.001-0.003, the grid step is 1/63 or less
    tensor[0] = 1.0
    error = torch.zeros_like(tensor)
    plain, fed_back = torch.zeros_like(tensor), torch.zeros_like(tensor)
    for _ in range(steps):
        plain += int8_all_reduce(tensor)
        fed_back += int8_all_reduce(tensor, error)
    return {"true": tensor, "plain": plain / steps, "error feedback": fed_back / steps,
            "grid_step": 1.0 / (127 // dist.get_world_size())}


def int8_hook(_, bucket):
    """A DDP communication hook: the bucket through ``int8_all_reduce``, no memory."""
    return _done(bucket.buffer().copy_(int8_all_reduce(bucket.buffer())))


def _done(tensor: torch.Tensor) -> torch.futures.Future:
    future = torch.futures.Future()
    future.set_result(tensor)
    return future


class ErrorFeedbackState:
    """The state of ``int8_error_feedback_hook``: this rank's error buffer per bucket, and
    the iteration count (as ``PowerSGDState.iter``).

    DDP buckets the gradients twice: its first iteration runs one bucket of every parameter
    (torch/nn/parallel/distributed.py:154, ``[sys.maxsize]``, and the comment at :1402-1405);
    before the second forward it rebuilds them in the order backward produced the gradients,
    a first bucket of about 1 MiB and 25 MiB ones after it (:1769-1775, once per training).
    An error buffer kept from iteration 1 no longer matches bucket 0 of iteration 2 on a model
    over 1 MiB. So, as PowerSGD does (``start_powerSGD_iter`` must be > 1 with error feedback,
    torch/distributed/algorithms/ddp_comm_hooks/powerSGD_hook.py:215-225), the first
    iteration is plain int8 and the error buffers start at the second."""

    def __init__(self):
        self.iteration = 0
        self.errors: dict[int, torch.Tensor] = {}


def int8_error_feedback_hook(state: ErrorFeedbackState, bucket):
    """A DDP communication hook: the bucket through ``int8_all_reduce`` with this rank's
    error buffer for that bucket index, from the second iteration on (after DDP's bucket
    rebuild; see ``ErrorFeedbackState``)."""
    buffer = bucket.buffer()
    error = None
    if state.iteration >= 1:
        error = state.errors.setdefault(bucket.index(), torch.zeros_like(buffer))
        if error.shape != buffer.shape:
            raise RuntimeError(
                f"int8_error_feedback_hook: bucket {bucket.index()} has {buffer.numel()} "
                f"entries, its error buffer {error.numel()}: DDP's buckets changed after the "
                "error feedback started (a second rebuild?); start a new ErrorFeedbackState")
    if bucket.is_last():
        state.iteration += 1
    return _done(buffer.copy_(int8_all_reduce(buffer, error)))


def _powersgd():
    """Rank-1 PowerSGD after two plain iterations (notebook 07's setting)."""
    state = powerSGD_hook.PowerSGDState(process_group=None, matrix_approximation_rank=1,
                                        start_powerSGD_iter=2, min_compression_rate=2)
    return state, powerSGD_hook.powerSGD_hook


HOOKS = {
    "all-reduce (default)": lambda: (None, default_hooks.allreduce_hook),
    "int8": lambda: (None, int8_hook),
    "int8 + error feedback": lambda: (ErrorFeedbackState(), int8_error_feedback_hook),
    "PowerSGD rank 1": _powersgd,
}
WAYS = tuple(HOOKS)


def train(way: str, steps: int = 40, batch: int = 32, lr: float = 0.1) -> dict:
    """Notebook 07's regression with the gradients all-reduced ``way``: per step the loss
    of this rank's batch and the bytes this rank all-reduced."""
    ddp = DDP(make_mlp(MODEL))
    ddp.register_comm_hook(*HOOKS[way]())
    optimizer = torch.optim.SGD(ddp.parameters(), lr=lr, momentum=0.9)
    x, y = regression_data(MODEL, steps * batch * dist.get_world_size())
    losses, sent = [], []
    for step in range(steps):
        optimizer.zero_grad()
        with CollectiveTrace() as trace:
            loss = F.mse_loss(ddp(rank_slice(x, step, batch)), rank_slice(y, step, batch))
            loss.backward()
        optimizer.step()
        losses.append(loss.item())
        sent.append(sum(call.nbytes for call in trace.of("all_reduce")))
    return {"loss": losses, "bytes": sent}


def compare(steps: int = 40) -> dict:
    """Every way in one launch, and the small-entries demo: this rank's results."""
    return {"training": {way: train(way, steps) for way in WAYS},
            "small entries": small_entries_survive()}
