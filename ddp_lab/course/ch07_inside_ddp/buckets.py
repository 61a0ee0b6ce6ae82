"""Which gradient lands in which bucket, and in what order the buckets leave (notebook 07).

DDP's Reducer packs gradients into flat buckets of about ``bucket_cap_mb`` and all-reduces
a bucket once every gradient in it is ready. In this version of torch the first iteration
uses ONE bucket for everything (DDP cannot know the order in which backward will produce
the gradients); at the end of it, the Reducer rebuilds the buckets in the order the
gradients really arrived (the reverse of the forward order): a small first bucket of
``dist._DEFAULT_FIRST_BUCKET_BYTES`` (1 MiB, only when ``bucket_cap_mb`` is left at its
default), then buckets of ``bucket_cap_mb``. Greedy packing: a bucket closes as soon as it
reaches its cap, so a parameter never splits and a bucket may overshoot.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from ddp_lab.course.ch07_inside_ddp.workload import BucketRecorder
from ddp_lab.course.models import MLPConfig, make_mlp
from ddp_lab.course.units import MiB

# An MNIST-sized MLP: fc0 is 1.6 MB, fc1-fc3 1 MB each, the fc4 head 20 kB.
LAYOUT_MODEL = MLPConfig(inputs=784, width=512, depth=5, outputs=10)
LOGGED = ("bucket_sizes", "rebuilt_bucket_sizes", "rebuilt_per_bucket_param_indices",
          "bucket_cap_bytes", "has_rebuilt_buckets", "num_buckets_reduced")


def bucket_layouts(config: MLPConfig = LAYOUT_MODEL, cap_mb=None, iterations: int = 3,
                   batch: int = 8) -> dict:
    """On each rank: train ``iterations`` steps and return what the Reducer did.

    "buckets": per iteration, the recorded buckets (index, bytes, params, ready, done);
    "grad_order": parameter names in the order their gradients were accumulated in the
    last iteration; "logging": DDP's own counters (``_get_ddp_logging_data``);
    "predicted": the rebuild's greedy packing, recomputed from the parameter sizes."""
    model = make_mlp(config)
    ddp = DDP(model, bucket_cap_mb=cap_mb)
    recorder = BucketRecorder(model).register(ddp)
    grad_order = _watch_gradients(model)
    x = torch.randn(batch, config.inputs, generator=torch.Generator().manual_seed(dist.get_rank()))
    for it in range(iterations):
        recorder.iteration = it
        grad_order.clear()
        ddp(x).square().mean().backward()
    logging = ddp._get_ddp_logging_data()
    return {"cap_mb": cap_mb, "params": _parameter_sizes(model),
            "buckets": [recorder.of_iteration(it) for it in range(iterations)],
            "grad_order": list(grad_order), "logging": {k: logging.get(k) for k in LOGGED},
            "predicted": predicted_layout(model, cap_mb)}


def layouts_for_caps(caps=(None, 1, 4), config: MLPConfig = LAYOUT_MODEL) -> list[dict]:
    """``bucket_layouts`` for several ``bucket_cap_mb`` values in one launch."""
    return [bucket_layouts(config, cap) for cap in caps]


def _watch_gradients(model) -> list[str]:
    """A list that fills with parameter names as their gradients are accumulated: the
    moment the Reducer's own autograd hook fires for that parameter."""
    order = []
    for name, p in model.named_parameters():
        p.register_post_accumulate_grad_hook(lambda _p, name=name: order.append(name))
    return order


def _parameter_sizes(model) -> list[tuple[str, int]]:
    return [(name, p.numel() * p.element_size()) for name, p in model.named_parameters()]


def predicted_layout(model, cap_mb=None) -> list[list[str]]:
    """The rebuilt buckets as DDP computes them: gradients in ready order (the reverse of
    the parameters' order), packed greedily by ``dist._compute_bucket_assignment_by_size``
    with a 1 MiB first bucket when the cap is the default."""
    named = list(reversed(list(model.named_parameters())))
    cap = int((25 if cap_mb is None else cap_mb) * MiB)
    limits = [dist._DEFAULT_FIRST_BUCKET_BYTES, cap] if cap_mb is None else [cap]
    indices, _ = dist._compute_bucket_assignment_by_size([p for _, p in named], limits)
    return [[named[i][0] for i in bucket] for bucket in indices]


def bucket_table(layout: dict, iteration: int) -> str:
    """The buckets of one iteration as text: index, size, when ready, parameters."""
    records = layout["buckets"][iteration]
    t0 = min(r["ready"] for r in records)
    lines = [f"{'bucket':>6} {'size':>10} {'ready at':>9}  parameters"]
    for r in sorted(records, key=lambda r: r["index"]):
        lines.append(f"{r['index']:>6} {r['bytes'] / 1e6:>8.2f}MB {(r['ready'] - t0) * 1e3:>7.2f}ms"
                     f"  {', '.join(r['params'])}")
    return "\n".join(lines)


def show_buckets(cap_mb=None) -> list[int]:
    """``ddp-lab run buckets``: rank 0 prints the buckets of iterations 0 and 1; every
    rank returns the sizes of its rebuilt buckets."""
    layout = bucket_layouts(cap_mb=cap_mb)
    if dist.get_rank() == 0:
        for it in (0, 1):
            print(f"iteration {it}:\n{bucket_table(layout, it)}")
    return [r["bytes"] for r in layout["buckets"][1]]
