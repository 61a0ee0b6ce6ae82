"""02.all_gather with a typical learner slip: receive buffers made with torch.zeros(shape)
(float32) while the tensors are int64 on some world sizes. Does the check name the mismatch?
Run from the root of a checkout of 46d1faf:
flock /tmp/ddp-lab-cpu.lock .venv/bin/python docs/reviews/repro/02_learner_wrong_dtype.py"""
from ddp_lab.exercises.registry import find


def my_all_gather(tensor):
    import torch
    import torch.distributed as dist
    rank, world = dist.get_rank(), dist.get_world_size()
    out = [torch.zeros(tensor.shape) for _ in range(world)]   # float32, whatever tensor is
    out[rank] = tensor.clone()
    reqs = [dist.isend(tensor, p) for p in range(world) if p != rank]
    reqs += [dist.irecv(out[p], p) for p in range(world) if p != rank]
    for r in reqs:
        r.wait()
    return out


for attempt in range(2):
    try:
        print(find("02.all_gather").checker(my_all_gather))
    except BaseException as exc:  # noqa: BLE001
        print(type(exc).__name__ + ":", str(exc)[:700])
