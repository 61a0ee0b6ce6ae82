"""05 review: (a) the collectives DDP's constructor issues; (b) ReduceOp.AVG on gloo;
(c) a GradScaler skip when one rank's loss is NaN-free but its grads are -inf/+inf on two ranks."""
import torch, torch.distributed as dist, torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
import ddp_lab
from ddp_lab.course.collective_trace import CollectiveTrace
from ddp_lab.course.models import ToyModel


def worker():
    out = {}
    torch.manual_seed(0)
    with CollectiveTrace(dist.get_world_size()) as t:
        DDP(ToyModel())
    out["constructor"] = [c.name for c in t.calls]
    x = torch.tensor([1.0, 2.0]) * (dist.get_rank() + 1)
    try:
        dist.all_reduce(x, op=dist.ReduceOp.AVG)
        out["avg"] = x.tolist()
    except Exception as e:
        out["avg"] = f"{type(e).__name__}: {e}"[:200]
    return out


if __name__ == "__main__":
    for n in (1, 3):
        print(n, ddp_lab.run(worker, world_size=n, echo=False).values)
