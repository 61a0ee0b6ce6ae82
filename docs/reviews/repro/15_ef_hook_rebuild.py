"""int8_error_feedback_hook keys its error buffers by bucket.index(); DDP rebuilds its buckets
after the first iteration. On a model larger than DDP's first bucket (1 MiB) the buffer of
bucket 0 changes size between iteration 1 and 2. Run: python docs/reviews/repro/15_ef_hook_rebuild.py
(Since the fix the hook's state is a quantized.ErrorFeedbackState and its buffers start at
iteration 2: this prints failed_at_step None.)"""
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

import ddp_lab
from ddp_lab.course.ch15_resilience import diloco, quantized
from ddp_lab.course.models import make_mlp


def worker():
    ddp = DDP(make_mlp(diloco.SyncConfig().model))       # 1.29 MB of fp32 parameters
    errors, sizes = quantized.ErrorFeedbackState(), []

    def hook(state, bucket):
        sizes.append((bucket.index(), bucket.buffer().numel()))
        return quantized.int8_error_feedback_hook(state, bucket)

    ddp.register_comm_hook(errors, hook)
    x = torch.randn(16, 64)
    for step in range(3):
        try:
            F.mse_loss(ddp(x), torch.zeros(16, 8)).backward()
        except Exception as e:  # noqa: BLE001
            return {"sizes": sizes, "failed_at_step": step, "error": str(e)[:300]}
    return {"sizes": sizes, "failed_at_step": None}


if __name__ == "__main__":
    print(ddp_lab.run(worker, world_size=2, echo=False).values[0])
