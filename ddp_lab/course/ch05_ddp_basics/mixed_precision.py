"""Notebook 05, mixed precision under DDP: ``torch.autocast`` for the forward, a
``GradScaler`` for the loss, and why the ranks' scalers agree without talking to each other.

``GradScaler.unscale_`` looks for inf/NaN in this rank's own ``.grad``
(``torch._amp_foreach_non_finite_check_and_unscale_``, torch/amp/grad_scaler.py), ``step``
skips the optimizer when it found one and ``update`` multiplies the scale by
``backoff_factor`` (0.5). Under DDP those ``.grad`` are the all-reduced average by the time
``backward()`` returns, so an overflow on one rank is an inf on every rank: every scaler skips
the same step and backs off the same way, and the replicas stay equal. Without DDP's
all-reduce (ranks averaging later, by hand, after ``unscale_``) the scalers could disagree.

Autocast casts inside the forward's ops only: parameters, ``.grad`` and so DDP's buckets
stay float32, and the all-reduce moves as many bytes as without it (``CollectiveTrace``
around backward records them). Fewer bytes take a comm hook (``bf16_compress_hook``,
torch/distributed/algorithms/ddp_comm_hooks/default_hooks.py) or DDP's ``mixed_precision=``.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

from ddp_lab.course.collective_trace import CollectiveTrace
from ddp_lab.course.models import ToyModel
from ddp_lab.course.params import flat_params


def overflow_on_one_rank(steps: int = 4, bad_step: int = 1, bad_rank: int = 1,
                         bad_factor: float = 1000.0) -> list[dict]:
    """Train ToyModel under DDP with fp16 autocast and a GradScaler; at ``bad_step`` the
    inputs of ``bad_rank`` alone are ``bad_factor`` times larger, and its scaled fp16
    backward overflows. Per step: whether this rank's own gradients (a ``no_sync`` backward
    of the same batch, before any all-reduce) were finite, whether its all-reduced gradients
    were, whether the step was taken, the scale after it, and the all-reduces of backward as
    (dtype, bytes)."""
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = DDP(ToyModel())
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    scaler = torch.amp.GradScaler("cpu")
    record = []
    for step in range(steps):
        inputs, targets = _batch(rank, step)
        if step == bad_step and rank == bad_rank:
            inputs = inputs * bad_factor
        before = flat_params(model).clone()
        optimizer.zero_grad()
        with model.no_sync():  # this rank's own gradients, no all-reduce: only to look at them
            scaler.scale(_loss(model, inputs, targets)[0]).backward()
        own_finite = _finite_grads(model)
        optimizer.zero_grad()
        loss, forward_dtype = _loss(model, inputs, targets)
        with CollectiveTrace() as trace:
            scaler.scale(loss).backward()
        grads_finite = _finite_grads(model)
        scaler.step(optimizer)
        scaler.update()
        record.append({"step": step, "own_grads_finite": own_finite,
                       "grads_finite": grads_finite,
                       "stepped": not torch.equal(before, flat_params(model)),
                       "scale": float(scaler.get_scale()),
                       "all_reduced": [(str(c.dtype).replace("torch.", ""), c.nbytes)
                                       for c in trace.of("all_reduce")],
                       "forward_dtype": forward_dtype})
    record.append({"params": flat_params(model).clone()})
    return record


def _loss(model, inputs, targets) -> tuple[torch.Tensor, str]:
    with torch.autocast("cpu", dtype=torch.float16):
        outputs = model(inputs)
    return F.mse_loss(outputs.float(), targets), str(outputs.dtype).replace("torch.", "")


def _finite_grads(model) -> bool:
    return all(bool(torch.isfinite(p.grad).all()) for p in model.parameters())


def _batch(rank: int, step: int) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(1000 * rank + step)
    return torch.randn(20, 10, generator=generator), torch.randn(20, 5, generator=generator)


def ranges() -> dict[str, float]:
    """The largest finite value of each 16-bit format: fp16's 65504 is why fp16 training
    needs a loss scale; bf16 keeps float32's 8 exponent bits, so its gradients do not
    overflow where float32's would not, and it runs without a scaler."""
    return {str(d).replace("torch.", ""): torch.finfo(d).max
            for d in (torch.float16, torch.bfloat16, torch.float32)}
