"""ZeRO stage 1 from the collectives: every rank keeps the optimizer state of only its share
of the parameters (Rajbhandari et al., "ZeRO", https://arxiv.org/abs/1910.02054).

Gradients are averaged as usual (DDP's all-reduce), so every rank could update every
parameter; instead each parameter has one owner, only the owner runs the optimizer on it
(so only the owner holds its Adam moments), and the owner then broadcasts the new values.
The parameters are split greedily by size, the same idea as torch's
``ZeroRedundancyOptimizer`` (torch/distributed/optim/zero_redundancy_optimizer.py,
``_partition_parameters``), so each rank holds about 1/world_size of the state.

What it leaves out: it is no ``torch.optim.Optimizer`` (no ``param_groups``, ``state_dict`` or
``load_state_dict``, so no learning-rate scheduler and no checkpoint of its state; torch's
``ZeroRedundancyOptimizer`` has them, with ``consolidate_state_dict`` to gather the state on
one rank), and it broadcasts one parameter at a time, where ``ZeroRedundancyOptimizer`` can
pack each rank's parameters into one buffer (``parameters_as_bucket_view=True``).
"""

from __future__ import annotations

import torch
import torch.distributed as dist


def partition(sizes: list[int], world_size: int) -> list[int]:
    """The owner rank of each parameter: largest first, each to the least loaded rank, so
    the shares of optimizer state stay close to 1/world_size (ties go to the lower rank)."""
    loads = [0] * world_size
    owners = [0] * len(sizes)
    for index in sorted(range(len(sizes)), key=lambda i: -sizes[i]):
        owner = min(range(world_size), key=lambda r: loads[r])
        owners[index] = owner
        loads[owner] += sizes[index]
    return owners


def zero1_step(params, owners, local_optimizer) -> None:
    """ZeRO-1's step: the owner of each parameter updates it (``local_optimizer`` holds only
    this rank's share; None on a rank that owns nothing), then every owner broadcasts the new
    values, all broadcasts posted before any is waited on. Every rank calls it: the
    broadcasts are collectives. Notebook 10's exercise 10.zero1_step, whose reference this
    is (its solved cell pastes this source, so it uses nothing but torch and dist)."""
    if local_optimizer is not None:
        local_optimizer.step()
    works = [dist.broadcast(p.data, src=owner, async_op=True)
             for p, owner in zip(params, owners)]
    for work in works:
        work.wait()


class ShardedOptimizer:
    """Wrap any ``torch.optim`` class: ``ShardedOptimizer(model.parameters(), torch.optim.Adam,
    lr=1e-3)``. Call ``step()`` after the gradients were averaged across ranks (DDP does it);
    every rank must call ``step()``, since the broadcasts are collectives."""

    def __init__(self, params, optimizer_cls, **optimizer_kwargs):
        self.params = [p for p in params]
        if not self.params or not all(isinstance(p, torch.Tensor) for p in self.params):
            raise ValueError("ShardedOptimizer needs a non-empty iterable of tensors, e.g. "
                             "model.parameters()")
        if not isinstance(optimizer_cls, type) or not issubclass(optimizer_cls, torch.optim.Optimizer):
            raise TypeError(f"optimizer_cls must be a torch.optim.Optimizer class such as "
                            f"torch.optim.Adam, got {optimizer_cls!r}")
        self.rank = dist.get_rank()
        self.owners = partition([p.numel() for p in self.params], dist.get_world_size())
        mine = [p for p, owner in zip(self.params, self.owners) if owner == self.rank]
        # torch optimizers refuse an empty parameter list: a rank that owns nothing
        # (more ranks than parameters) simply has no local optimizer.
        self.local = optimizer_cls(mine, **optimizer_kwargs) if mine else None

    def step(self) -> None:
        """Update this rank's share, then every owner broadcasts its parameters' new values."""
        zero1_step(self.params, self.owners, self.local)

    def zero_grad(self, set_to_none: bool = True) -> None:
        for p in self.params:
            if set_to_none:
                p.grad = None
            elif p.grad is not None:
                p.grad.zero_()

    def state_bytes(self) -> int:
        """Bytes of optimizer state (momenta, step counters) this rank holds."""
        if self.local is None:
            return 0
        return sum(t.numel() * t.element_size() for state in self.local.state.values()
                   for t in state.values() if isinstance(t, torch.Tensor))
