"""FSDP2's switches, each run for real on the course's MLP (notebook 10, section 8):
mixed precision, CPU offload, HSDP on a 2-D mesh, gradient accumulation without
communication and gradient clipping on sharded gradients. Every function runs on each rank
and returns small CPU data; ``every_feature`` runs them all (and the ones in
``fsdp2_lifecycle``) in one launch, because starting ranks costs more than the demos.

Sources (torch 2.13): ``torch/distributed/fsdp/_fully_shard/_fsdp_api.py`` (the policies),
``_fully_shard.py`` (``fully_shard``, ``set_requires_gradient_sync``), ``_fsdp_param.py`` and
``_fsdp_collectives.py`` (where the policies act).
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn as nn

from ddp_lab.course.ch10_sharding import fsdp2_lifecycle
from ddp_lab.course.ch10_sharding.equivalence import (TrainConfig, fsdp2_torch, global_batch,
                                                     make_model, my_rows, train)
from ddp_lab.course.collective_trace import CollectiveTrace

FEATURES_MODEL = TrainConfig()  # 13 -> 31 -> 31 -> 7: no parameter splits evenly, 24 rows, 4 steps


def _loss(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return nn.functional.mse_loss(model(x), y)


def traced_backward(model: nn.Module, config: TrainConfig, step: int = 0) -> CollectiveTrace:
    """Forward and backward of this rank's rows of batch ``step``, every collective traced;
    the gradients stay in place."""
    x, y = global_batch(config, step)
    with CollectiveTrace(dist.get_world_size()) as trace:
        _loss(model, my_rows(x), my_rows(y)).backward()
    return trace


def collective_bytes(trace: CollectiveTrace) -> dict[str, int]:
    """Bytes per collective name: the larger of what goes in and what comes out."""
    found: dict[str, int] = {}
    for call in trace.calls:
        found[call.name] = found.get(call.name, 0) + call.nbytes
    return found


def grad_dtypes(model: nn.Module) -> dict[str, tuple]:
    """For each parameter: (its class, its dtype, its gradient's class, its gradient's dtype)."""
    return {name: (type(p).__name__, p.dtype, type(p.grad).__name__, p.grad.dtype)
            for name, p in model.named_parameters()}


def mixed_precision(config: TrainConfig = FEATURES_MODEL) -> dict:
    """``MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32)`` against plain FSDP2: the
    dtype of each unsharded weight while its layer runs (seen by a forward pre-hook, which
    runs after FSDP's own: FSDP registers its pre-hook with ``prepend=True``), the sharded
    parameters and gradients after backward, and the bytes of the all-gathers and
    reduce-scatters of one forward and backward."""
    from torch.distributed.fsdp import MixedPrecisionPolicy
    policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    model = fsdp2_torch(config, mp_policy=policy).model
    in_forward = []
    for layer in model:
        if isinstance(layer, nn.Linear):
            layer.register_forward_pre_hook(
                lambda m, args: in_forward.append((type(m.weight).__name__, m.weight.dtype)))
    mixed = traced_backward(model, config)
    plain = traced_backward(fsdp2_torch(config).model, config)
    return {"in_forward": in_forward, "after_backward": grad_dtypes(model),
            "bytes": collective_bytes(mixed), "plain_bytes": collective_bytes(plain)}


def cpu_offload(config: TrainConfig = FEATURES_MODEL) -> dict:
    """``CPUOffloadPolicy``: what this CPU-only machine can show. The default
    ``pin_memory=True`` needs an accelerator (page-locked memory is a CUDA driver service),
    so here it is refused; with ``pin_memory=False`` the policy is accepted, trains, and
    every sharded parameter, gradient and optimizer state is on the CPU, as it is without
    the policy on a CPU mesh."""
    from torch.distributed.fsdp import CPUOffloadPolicy
    try:
        fsdp2_torch(config, offload_policy=CPUOffloadPolicy())
        pinned = "accepted"
    except RuntimeError as error:
        pinned = f"{type(error).__name__}: {error}"
    setup = fsdp2_torch(config, offload_policy=CPUOffloadPolicy(pin_memory=False))
    result = train(setup, config)
    traced_backward(setup.model, config)  # leave gradients to look at
    state = [t for s in setup.optimizer.state.values() for t in s.values()]
    devices = {"parameters": {p.to_local().device.type for p in setup.model.parameters()},
               "gradients": {p.grad.to_local().device.type for p in setup.model.parameters()},
               "optimizer state": {t.device.type for t in state}}
    return {"pin_memory=True": pinned, "devices": devices, **result}


def hsdp(config: TrainConfig = FEATURES_MODEL) -> dict:
    """HSDP: a 2-D mesh (replicate x shard) given to ``fully_shard``. Each parameter is
    sharded over the "shard" dimension and replicated over the "replicate" one; a gradient
    is reduce-scattered inside its shard group, then all-reduced across the replicas. The
    placements, the collectives of one forward and backward with their group sizes, and a
    whole training (to compare with one process)."""
    from torch.distributed.device_mesh import init_device_mesh
    n = dist.get_world_size()
    mesh = init_device_mesh("cpu", (n // 2, 2), mesh_dim_names=("replicate", "shard"))
    setup = fsdp2_torch(config, mesh=mesh)
    placements = {name: p.placements for name, p in setup.model.named_parameters()}
    trace = traced_backward(setup.model, config)
    setup.optimizer.zero_grad()
    calls = sorted({(c.name, c.group_size) for c in trace.calls})
    return {"mesh": tuple(mesh.shape), "placements": placements, "calls": calls,
            "counts": trace.counts(), **train(setup, config)}


def hsdp_accumulation(config: TrainConfig = FEATURES_MODEL, micro_batches: int = 3) -> dict:
    """HSDP's middle way for gradient accumulation: ``set_requires_all_reduce(False)``
    (T/distributed/fsdp/_fully_shard/_fully_shard.py:437-451) keeps each micro-batch's
    reduce-scatter, so a rank holds only its *sharded* gradient between micro-batches, and
    defers only the all-reduce across replicas to the last one
    (``set_requires_gradient_sync(False)`` switches both off, :413-435). The collectives of
    the micro-batches and the accumulated gradient (gathered after the count)."""
    from torch.distributed.device_mesh import init_device_mesh
    n = dist.get_world_size()
    mesh = init_device_mesh("cpu", (n // 2, 2), mesh_dim_names=("replicate", "shard"))
    model = fsdp2_torch(config, mesh=mesh).model
    x, y = global_batch(config, 0)
    pieces = zip(my_rows(x).chunk(micro_batches), my_rows(y).chunk(micro_batches))
    with CollectiveTrace(n) as trace:
        for i, (xi, yi) in enumerate(pieces):
            model.set_requires_all_reduce(i == micro_batches - 1)
            (_loss(model, xi, yi) / micro_batches).backward()
    return {"counts": trace.counts(), "grads": _full_grads(model)}


def accumulate(model: nn.Module, config: TrainConfig, micro_batches: int,
               sync_each: bool) -> CollectiveTrace:
    """One step's gradient from ``micro_batches`` slices of this rank's rows: each backward
    reduces its gradient (``sync_each``), or only the last one does and the others
    accumulate unsharded gradients locally (``set_requires_gradient_sync(False)``)."""
    x, y = global_batch(config, 0)
    pieces = zip(my_rows(x).chunk(micro_batches), my_rows(y).chunk(micro_batches))
    with CollectiveTrace(dist.get_world_size()) as trace:
        for i, (xi, yi) in enumerate(pieces):
            if not sync_each:
                model.set_requires_gradient_sync(i == micro_batches - 1)
            (_loss(model, xi, yi) / micro_batches).backward()
    return trace


def _full_grads(model: nn.Module) -> dict[str, torch.Tensor]:
    return {name: p.grad.full_tensor() for name, p in model.named_parameters()}


def gradient_accumulation(config: TrainConfig = FEATURES_MODEL, micro_batches: int = 3) -> dict:
    """The same accumulated gradient twice, with and without a reduce-scatter per micro-batch:
    the collectives each way and the full gradients (gathered after the count)."""
    found = {}
    for name, sync_each in (("sync every micro-batch", True), ("sync the last only", False)):
        model = fsdp2_torch(config).model
        trace = accumulate(model, config, micro_batches, sync_each)
        found[name] = {"counts": trace.counts(), "grads": _full_grads(model)}
    return found


def one_process_grads(config: TrainConfig = FEATURES_MODEL, max_norm: float | None = None) -> dict:
    """The gradient of the whole first batch in one process (clipped to ``max_norm`` if
    given), and the norm ``clip_grad_norm_`` saw."""
    model = make_model(config)
    _loss(model, *global_batch(config, 0)).backward()
    norm = torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm or float("inf"))
    return {"norm": norm.item(),
            "grads": {name: p.grad.clone() for name, p in model.named_parameters()}}


def clipping(config: TrainConfig = FEATURES_MODEL, max_norm: float = 0.1) -> dict:
    """``clip_grad_norm_`` on FSDP2's sharded gradients: each rank's norms cover its shards
    only (DTensor ``Partial``), so the total norm needs one all-reduce. DTensor issues it
    inside its ``__torch_dispatch__``; a dispatch mode that defers to the subclass stays on
    the mode stack while it runs and sees that all-reduce, so both ``CollectiveTrace`` and
    torch's ``CommDebugMode`` (T/distributed/tensor/debug/_comm_mode.py) record it: both
    watch the same call here, ``CommDebugMode``'s counts in ``counts``, ``CollectiveTrace``'s
    calls (name, bytes, group size) in ``calls``. The norm and the clipped gradients,
    gathered afterwards."""
    from torch.distributed.tensor.debug import CommDebugMode
    model = fsdp2_torch(config).model
    traced_backward(model, config)
    with CollectiveTrace(dist.get_world_size()) as trace, CommDebugMode() as comm:
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
    counts = {str(op).split(".")[-1]: n for op, n in comm.get_comm_counts().items()}
    return {"norm": norm.full_tensor().item(), "norm_placements": norm.placements,
            "counts": counts, "calls": [(c.name, c.nbytes, c.group_size) for c in trace.calls],
            "grads": _full_grads(model)}


def every_feature(config: TrainConfig = FEATURES_MODEL) -> dict:
    """All of section 8's demos, one after the other in the same ranks (an even world size:
    HSDP splits it into replicas of 2)."""
    return {"mixed precision": mixed_precision(config), "cpu offload": cpu_offload(config),
            "hsdp": hsdp(config), "hsdp accumulation": hsdp_accumulation(config),
            "accumulation": gradient_accumulation(config),
            "clipping": clipping(config), "meta init": fsdp2_lifecycle.meta_init(config),
            "resume": fsdp2_lifecycle.resume_from_checkpoint(config),
            "fsdp1 vs fsdp2": fsdp2_lifecycle.fsdp1_and_fsdp2(config),
            "construction": fsdp2_lifecycle.no_sync_at_construction()}
