"""Does torch 2.13's DDP (find_unused_parameters=True, and the default False) leave what
05.average_gradients' checker expects: the mean of the ranks' gradients, None for the frozen
and the never-used layer? 2 and 3 ranks, the checker's own RandomNet and batches."""
import torch
import ddp_lab
from ddp_lab.course.ch05_ddp_basics import exercises as c5


def rank(seed, world, find_unused):
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP
    model = c5.random_model(seed)
    ddp = DDP(model, find_unused_parameters=find_unused)
    c5._backward(ddp, c5.batches(seed, world, model.in_features)[dist.get_rank()])
    return [p.grad for p in model.parameters()]


for seed in (11, 12, 13):
    for world in (2, 3):
        model = c5.random_model(seed)
        batches = c5.batches(seed, world, model.in_features)
        want = c5.mean_gradients(c5.rank_gradients(model, batches))
        for find_unused in (True, False):
            got = ddp_lab.run(rank, world_size=world, args=(seed, world, find_unused),
                              echo=False).values
            ok = all((w is None and g is None) or (w is not None and g is not None and
                     torch.allclose(g, w, rtol=1e-5, atol=1e-6))
                     for grads in got for g, w in zip(grads, want))
            nones = [i for i, w in enumerate(want) if w is None]
            print(f"seed {seed} world {world} find_unused={find_unused}: "
                  f"None at {nones}, every rank equals the checker's expectation: {ok}")

# With the default find_unused_parameters=False: which gradients differ, and are they the
# rank's own (nothing exchanged)?
seed, world = 11, 2
model = c5.random_model(seed)
batches = c5.batches(seed, world, model.in_features)
own = c5.rank_gradients(model, batches)
want = c5.mean_gradients(own)
got = ddp_lab.run(rank, world_size=world, args=(seed, world, False), echo=False).values
for r, grads in enumerate(got):
    for i, (g, w, o) in enumerate(zip(grads, want, own[r])):
        if w is None:
            print(f"find_unused=False rank {r} param {i}: expected None, got {None if g is None else 'a tensor'}")
        else:
            print(f"find_unused=False rank {r} param {i}: mean {torch.allclose(g, w, rtol=1e-5, atol=1e-6)}, "
                  f"own {torch.allclose(g, o)}")
