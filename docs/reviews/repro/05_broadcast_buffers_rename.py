"""05 review: is forward_sync_buffers just the new name of broadcast_buffers (cell 14)?
Each rank gives its BatchNorm a different running_mean, wraps it three ways, and reports
whether the ranks' buffers agree right after DDP(...) (before any forward)."""
import warnings
import torch, torch.distributed as dist, torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
import ddp_lab


def worker():
    out = {}
    for label, kwargs in (("default", {}), ("broadcast_buffers=False", {"broadcast_buffers": False}),
                          ("forward_sync_buffers=False", {"forward_sync_buffers": False})):
        model = nn.Sequential(nn.Linear(3, 3), nn.BatchNorm1d(3))
        model[1].running_mean.fill_(float(dist.get_rank()))  # rank-local buffer
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            DDP(model, **kwargs)
        mine = model[1].running_mean.clone()
        every = [torch.empty_like(mine) for _ in range(dist.get_world_size())]
        dist.all_gather(every, mine)
        out[label] = "buffers equal after DDP(...)" if all(torch.equal(e, every[0]) for e in every) \
            else "buffers left rank-local"
    return out


if __name__ == "__main__":
    print(ddp_lab.run(worker, world_size=2, echo=False).values[0])
