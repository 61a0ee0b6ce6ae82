"""Notebook 07's instruments for looking inside DDP: the synthetic data that every section's
MLP (``ddp_lab.course.models.make_mlp``) trains on, and ``BucketRecorder``, a communication
hook that does what DDP does by default (average the bucket with one all-reduce) and writes
down every bucket it sees.

DDP's Reducer (C++) groups gradients into buckets and all-reduces a bucket as soon as all
its gradients are ready. A communication hook replaces that all-reduce, so it is the one
place where Python sees each bucket: its index, its flat buffer, its parameters, and when
it became ready. ``torch.distributed.algorithms.ddp_comm_hooks`` documents the interface.
"""

from __future__ import annotations

import time

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

from ddp_lab.course.models import MLPConfig
from ddp_lab.launch.backends import cuda_backend


def regression_data(config: MLPConfig, samples: int, seed: int = 1):
    """A fixed task: inputs and the outputs of a random 'teacher' (a seeded tanh map).
    Every process builds the same tensors, so a rank takes its share by slicing."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(samples, config.inputs, generator=gen)
    teacher = torch.randn(config.inputs, config.outputs, generator=gen) / config.inputs ** 0.5
    return x, torch.tanh(x @ teacher * 2)


def hook_device(backend: str, gpu_count: int, local_rank: int) -> torch.device:
    """Where a rank of a group created with ``backend`` trains a model with a communication
    hook: a GPU whenever the machine has one and the group moves CUDA tensors (its own GPU
    under NCCL; under gloo, through host memory, GPUs may be shared), else the CPU.

    Not the CPU on a machine with CUDA, because of PowerSGD: its hook calls
    ``torch.cuda.synchronize(device)`` whenever ``torch.cuda.is_available()``, with its
    bucket's device, and that raises "Expected a cuda device, but got: cpu" for CPU
    tensors (powerSGD_hook.py in torch 2.13, in both powerSGD_hook and
    batched_powerSGD_hook; ``powersgd_cuda_sync_lines`` finds them)."""
    if gpu_count and cuda_backend(backend) is not None:
        return torch.device("cuda", local_rank % gpu_count)
    return torch.device("cpu")


def powersgd_cuda_sync_lines() -> list[int]:
    """The lines of torch's powerSGD_hook.py that synchronize CUDA whenever it is available,
    whatever the bucket's device (two in torch 2.13: 630-631 and 854-855)."""
    import inspect
    import re

    from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook
    source = inspect.getsource(powerSGD_hook)
    pattern = r"if torch\.cuda\.is_available\(\):\s*\n\s*torch\.cuda\.synchronize\(device\)"
    return [source.count("\n", 0, m.start()) + 1 for m in re.finditer(pattern, source)]


def rank_slice(tensor: torch.Tensor, step: int, per_rank: int) -> torch.Tensor:
    """This rank's ``per_rank`` rows of step ``step``'s global batch (rank-major)."""
    rank, world = dist.get_rank(), dist.get_world_size()
    start = (step * world + rank) * per_rank
    return tensor[start:start + per_rank]


class BucketRecorder:
    """A communication hook's state: one record per bucket all-reduced.

    Each record has the iteration (set ``.iteration`` before each step), the bucket's
    index, its size, its parameters' names, the time the Reducer handed it over (all its
    gradients were ready) and the time its all-reduce completed (the future's callback).
    """

    def __init__(self, model: nn.Module):
        self.names = {p: name for name, p in model.named_parameters()}
        self.iteration = 0
        self.records: list[dict] = []

    def register(self, ddp_model) -> "BucketRecorder":
        ddp_model.register_comm_hook(self, record_and_all_reduce)
        return self

    def of_iteration(self, iteration: int) -> list[dict]:
        return [r for r in self.records if r["iteration"] == iteration]

    def per_iteration(self, key: str | None = None, iterations: int | None = None) -> list:
        """Per iteration, the number of buckets all-reduced (``key=None``) or the sum of
        ``key`` over them (e.g. "bytes"); 0 for an iteration that sent nothing."""
        if iterations is None:
            iterations = 1 + max((r["iteration"] for r in self.records), default=-1)
        return [sum(1 if key is None else r[key] for r in self.of_iteration(i))
                for i in range(iterations)]


def record_and_all_reduce(recorder: BucketRecorder, bucket):
    """DDP's default behaviour (divide by world size, all-reduce SUM), plus a record.

    (No return annotation: DDP rejects any but ``torch.futures.Future[torch.Tensor]``,
    and ``from __future__ import annotations`` would turn that into a string.)"""
    buffer = bucket.buffer()
    record = {"iteration": recorder.iteration, "index": bucket.index(),
              "numel": buffer.numel(), "bytes": buffer.numel() * buffer.element_size(),
              "params": [recorder.names[p] for p in bucket.parameters()],
              "ready": time.time(), "done": None}
    recorder.records.append(record)

    def mark_done(fut):
        record["done"] = time.time()
        return fut.value()

    return default_hooks.allreduce_hook(None, bucket).then(mark_done)
