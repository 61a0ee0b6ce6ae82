"""07 review, cell 0: is the buffer broadcast before a forward decided only by "the forward
before it ran with grad enabled"? Each rank sets a rank-local running_mean right before a
forward; a forward pre-hook on the BatchNorm records what it sees on entry (0.0 on rank 1 means
rank 0's buffer was broadcast into it, 1.0 means no broadcast)."""
import torch, torch.distributed as dist, torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
import ddp_lab


def worker():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 3), nn.BatchNorm1d(3))
    ddp = DDP(model)
    seen = []
    model[1].register_forward_pre_hook(lambda m, a: seen.append(m.running_mean[0].item()))
    x = torch.randn(4, 3)
    rank = float(dist.get_rank())

    def fwd(label, ctx=None):
        model[1].running_mean.fill_(rank)  # make the buffer rank-local again
        if ctx is None:
            ddp(x).sum().backward()
        else:
            with ctx:
                ddp(x).sum().backward()
        return label

    labels = [fwd("1st forward (grad)"),
              fwd("2nd: after a grad forward"),
              fwd("3rd: in no_sync, after a grad forward outside", ddp.no_sync()),
              fwd("4th: outside no_sync, after a grad forward inside no_sync"),
              fwd("5th: after a grad forward outside no_sync")]
    return {l: ("broadcast" if s == 0.0 else "no broadcast") for l, s in zip(labels, seen)}


if __name__ == "__main__":
    r = ddp_lab.run(worker, world_size=2, echo=False).values[1]
    for k, v in r.items():
        print(f"rank 1, {k}: {v}")
