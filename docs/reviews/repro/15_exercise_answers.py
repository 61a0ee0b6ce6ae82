"""Notebook 15's exercise checker against answers a reviewer wrote: 3 wrong, 2 right."""
import torch
import torch.distributed as dist
import ddp_lab.exercises as ex


def fresh_torch_sgd(outer, local, momenta, outer_lr, momentum):
    """WRONG: torch's SGD made anew each round, ignoring the momenta passed in."""
    params = [torch.nn.Parameter(o.clone()) for o in outer]
    sgd = torch.optim.SGD(params, lr=outer_lr, momentum=momentum, nesterov=True)
    for p, o, m in zip(params, outer, local):
        d = o - m
        dist.all_reduce(d)
        p.grad = d / dist.get_world_size()
    sgd.step()
    return [p.detach() for p in params], [sgd.state[p]["momentum_buffer"] for p in params]


def sutskever_nesterov(outer, local, momenta, outer_lr, momentum):
    """WRONG: Nesterov with the lr inside the buffer (Sutskever's form), not torch's."""
    new_o, new_m = [], []
    for o, m, b in zip(outer, local, momenta):
        d = o - m
        dist.all_reduce(d)
        d /= dist.get_world_size()
        b = momentum * b + outer_lr * d
        new_m.append(b)
        new_o.append(o - (outer_lr * d + momentum * b))
    return new_o, new_m


def old_buffer_lookahead(outer, local, momenta, outer_lr, momentum):
    """WRONG: look-ahead with the OLD buffer: outer - lr * (d + momentum * old_buf)."""
    new_o, new_m = [], []
    for o, m, b in zip(outer, local, momenta):
        d = o - m
        dist.all_reduce(d)
        d /= dist.get_world_size()
        new_o.append(o - outer_lr * (d + momentum * b))
        new_m.append(momentum * b + d)
    return new_o, new_m


def mean_of_locals_in_place(outer, local, momenta, outer_lr, momentum):
    """RIGHT, written differently: average the local parameters, in-place updates."""
    world = dist.get_world_size()
    for o, m, b in zip(outer, local, momenta):
        avg = m.clone()
        dist.all_reduce(avg)
        d = o - avg / world
        b.mul_(momentum).add_(d)
        o.sub_(outer_lr * (d + momentum * b))
    return outer, momenta


def float64_tuple(outer, local, momenta, outer_lr, momentum):
    """RIGHT, written differently: float64 arithmetic, tuples returned."""
    world = dist.get_world_size()
    ds = []
    for o, m in zip(outer, local):
        d = (o - m).double()
        dist.all_reduce(d)
        ds.append(d / world)
    bufs = tuple(momentum * b.double() + d for b, d in zip(momenta, ds))
    return tuple(o.double() - outer_lr * (d + momentum * b) for o, d, b in zip(outer, ds, bufs)), bufs


if __name__ == "__main__":
    for fn in (fresh_torch_sgd, sutskever_nesterov, old_buffer_lookahead,
               mean_of_locals_in_place, float64_tuple):
        print("##", fn.__name__)
        try:
            ex.check("15.diloco_outer_step", fn)
        except Exception as e:  # noqa: BLE001
            print("raised", type(e).__name__, str(e)[:400])
