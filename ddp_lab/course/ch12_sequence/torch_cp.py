"""torch's own context parallelism on CPU (notebook 12): ``context_parallel`` shards the
buffers along the sequence and swaps ``scaled_dot_product_attention`` for a ring attention
through DTensor's sharding rules (torch/distributed/tensor/experimental/_attention.py). The
rules exist for the CUDA attention kernels (flash, efficient, cudnn) only; on CPU the op is
``_scaled_dot_product_flash_attention_for_cpu``, which has none, so a laptop gets an error,
not a slow run. That is why this notebook builds ring attention from the collectives.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F


def attempt() -> str:
    """Run causal attention under ``context_parallel`` on a CPU mesh; what happened."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.experimental import context_parallel
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    q, k, v = (torch.randn(1, 2, 16, 8) for _ in range(3))
    try:
        with context_parallel(mesh, buffers=[q, k, v], buffer_seq_dims=[2, 2, 2]):
            F.scaled_dot_product_attention(q, k, v, is_causal=True)
    except NotImplementedError as err:
        return f"NotImplementedError: {err}"
    return "ran"
