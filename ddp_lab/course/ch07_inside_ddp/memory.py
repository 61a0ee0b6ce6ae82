"""The gradient buckets' memory, and ``gradient_as_bucket_view`` (notebook 07): why a model
takes twice its size once wrapped in DDP, a common report:
https://discuss.pytorch.org/t/memory-consumption-for-the-model-get-doubled-after-wrapped-with-ddp/130837/4

By default each parameter's ``.grad`` is its own tensor, and the Reducer copies it into a
flat bucket buffer to all-reduce it (and the result back): the buckets are a second copy
of all the gradients, one model size more memory. With ``gradient_as_bucket_view=True``
each ``.grad`` IS a view into its bucket's buffer, so autograd writes the gradients
straight into the buckets and the second copy disappears.

``zero_grad()`` of modules and optimizers defaults to ``set_to_none=True`` since torch 2.0
(``torch/optim/optimizer.py``, ``Optimizer.zero_grad``): ``.grad`` becomes None after every
step, so the next backward's AccumulateGrad allocates a fresh gradient that is NOT a bucket
view, and the Reducer copies it into the bucket and points ``.grad`` back at the bucket
(``mark_variable_ready_dense`` in ``torch/csrc/distributed/c10d/reducer.cpp``): a copy and
a transient allocation per parameter per step. Both settings are measured here.

Measured in a fresh rank per configuration (each ``ddp_lab.run`` starts new processes):
the process's resident memory (RSS) once the model exists, then its peak while training.
On Linux the peak is reset after the warm-up steps (``/proc/self/clear_refs``), so it
shows the steady state rather than the one-off bucket rebuild after the first iteration.
"""

from __future__ import annotations

import re
import resource
import sys

import torch
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.nn.parallel import DistributedDataParallel as DDP

from ddp_lab.course.models import MLPConfig, make_mlp
from ddp_lab.course.units import MiB

# 3 layers of 3072 x 3072: 28 M parameters, 108 MiB. Every layer is larger than glibc's
# largest mmap threshold (32 MiB), so freed gradients go back to the OS and RSS shows it.
MEMORY_MODEL = MLPConfig(inputs=3072, width=3072, depth=3, outputs=3072)


def _rss() -> int:
    import psutil
    return psutil.Process().memory_info().rss


def _reset_peak() -> bool:
    """Reset the kernel's peak-RSS counter (Linux >= 4.0); False where that is impossible."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def _peak() -> int:
    """Peak RSS since the last reset (VmHWM), else since the process started (ru_maxrss)."""
    try:
        with open("/proc/self/status") as f:
            return int(re.search(r"VmHWM:\s+(\d+) kB", f.read()).group(1)) * 1024
    except (OSError, AttributeError):
        scale = 1 if sys.platform == "darwin" else 1024  # macOS counts bytes, Linux KiB
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * scale


# setup -> (gradient_as_bucket_view, or None for no DDP; zero_grad's set_to_none)
SETUPS = {"no DDP": (None, False), "DDP": (False, False),
          "DDP, gradient_as_bucket_view": (True, False),
          "no DDP, set_to_none": (None, True), "DDP, set_to_none": (False, True),
          "DDP, bucket view, set_to_none": (True, True)}


def training_memory(setup: str, config: MLPConfig = MEMORY_MODEL, warmup: int = 2,
                    steps: int = 2, batch: int = 8) -> dict:
    """On each (fresh) rank: MiB of parameters, and the RSS above the model's own memory at
    its peak during ``steps`` training steps and after them. ``setup`` is a key of SETUPS:
    the plain model (same steps, no communication), DDP, or DDP with bucket views, with
    ``zero_grad(set_to_none=False)`` (keep ``.grad``) or ``True`` (torch's default)."""
    view, set_to_none = SETUPS[setup]
    _train_briefly(view)
    model = make_mlp(config)
    model_rss = _rss()
    ddp = model if view is None else DDP(model, gradient_as_bucket_view=view)
    optimizer = torch.optim.SGD(ddp.parameters(), lr=1e-4)
    x = torch.randn(batch, config.inputs)
    for step in range(warmup + steps):
        if step == warmup:
            steady = _reset_peak()
        ddp(x).square().mean().backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=set_to_none)
    return {"setup": setup, "params_mib": config.parameters * 4 / MiB,
            "peak_mib": (_peak() - model_rss) / MiB, "after_mib": (_rss() - model_rss) / MiB,
            "steady_peak": steady}


def _train_briefly(view) -> None:
    """Two steps of a tiny model first, so that the code of forward, backward, DDP and
    the optimizer is loaded (its pages count in RSS too) before the measurement starts."""
    model = make_mlp(MLPConfig(inputs=8, width=8, depth=2))
    ddp = model if view is None else DDP(model, gradient_as_bucket_view=view)
    for _ in range(2):
        ddp(torch.randn(2, 8)).sum().backward()
        torch.optim.SGD(ddp.parameters(), lr=0.1).step()


def _record_buffers(buffers: list, bucket):
    """A comm hook that keeps each bucket's buffer (address range) before all-reducing."""
    buffer = bucket.buffer()
    buffers.append((buffer.data_ptr(), buffer.numel() * buffer.element_size()))
    return default_hooks.allreduce_hook(None, bucket)


def gradient_addresses(view: bool, config: MLPConfig = MLPConfig(), iterations: int = 2,
                       set_to_none: bool = False) -> dict:
    """On each rank: for every parameter, whether its ``.grad`` lies inside a bucket
    buffer after ``iterations`` steps, and at which byte offset (None: outside), with
    ``zero_grad(set_to_none=...)`` between the steps."""
    model = make_mlp(config)
    ddp = DDP(model, gradient_as_bucket_view=view, bucket_cap_mb=0.05)
    buffers: list = []
    ddp.register_comm_hook(buffers, _record_buffers)
    for _ in range(iterations):
        ddp.zero_grad(set_to_none=set_to_none)
        buffers.clear()
        ddp(torch.randn(4, config.inputs)).sum().backward()
    return {name: _offset_in(p.grad.data_ptr(), buffers) for name, p in model.named_parameters()}


def where_gradients_live() -> dict:
    """``gradient_addresses`` without and with bucket views (``zero_grad(set_to_none=
    False)``), and with views after ``set_to_none=True``, in one launch."""
    return {False: gradient_addresses(False), True: gradient_addresses(True),
            "view, set_to_none": gradient_addresses(True, set_to_none=True)}


def _offset_in(address: int, buffers: list):
    """(bucket number, byte offset) of an address inside one of the buffers, else None."""
    for k, (start, size) in enumerate(buffers):
        if start <= address < start + size:
            return k, address - start
    return None
