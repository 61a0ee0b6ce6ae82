"""05/05b/06 review: the exercise checkers against answers a learner will write."""
import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, DistributedSampler, Subset
import ddp_lab.exercises as ex


def avg_op(model):  # ReduceOp.AVG, as the recipe mentions
    for p in model.parameters():
        if p.grad is not None:
            dist.all_reduce(p.grad, op=dist.ReduceOp.AVG)


def sum_only(model):  # forgets the division
    for p in model.parameters():
        if p.grad is not None:
            dist.all_reduce(p.grad)


def acc_sampler(model, dataset):  # the tempting DistributedSampler version
    loader = DataLoader(dataset, batch_size=4, sampler=DistributedSampler(dataset, shuffle=False))
    c = torch.zeros(2)
    with torch.no_grad():
        for x, y in loader:
            c += torch.tensor([(model(x).argmax(1) == y).sum().item(), len(y)])
    dist.all_reduce(c)
    return (c[0] / c[1]).item()


def tp_float32(samples, seconds):
    s, t = torch.tensor(float(samples)), torch.tensor(float(seconds))
    dist.all_reduce(s); dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return (s / t).item()


for name, fn in (("05.average_gradients", avg_op), ("05.average_gradients", sum_only),
                 ("05b.global_accuracy", acc_sampler), ("06.global_throughput", tp_float32)):
    print(f"--- {name} with {fn.__name__}:")
    try:
        ex.check(name, fn)
    except Exception as err:
        print(type(err).__name__ + ":", " ".join(str(err).split())[:330])
