"""A mixture-of-experts layer with expert parallelism (GShard, https://arxiv.org/abs/2006.16668;
Switch Transformer, https://arxiv.org/abs/2101.03961).

A router scores every token against ``n_experts`` small MLPs and sends it to its ``top_k``
best; the output is the router-probability-weighted sum of those experts' outputs. With
expert parallelism each rank holds ``n_experts / world`` of the experts, so tokens travel:

1. each rank counts how many of its tokens go to each expert, and the ranks exchange those
   counts (an all-to-all of a few integers): every rank must know how much it will receive
   before the variable-size all-to-all;
2. **dispatch**: ``all_to_all_single`` with those split sizes sends each token's vector to
   the rank of its expert;
3. each rank runs its experts on what it received;
4. **combine**: the reverse all-to-all brings the results home, weighted and summed per token.

``capacity_factor``: each expert takes at most ``ceil(cf * tokens * top_k / n_experts)`` of a
rank's tokens (first choices first, then in token order); the rest are dropped (their
contribution is zero, a residual connection outside carries the token on). After a forward,
``stats`` holds the counts and ``aux_loss`` Switch's load-balancing loss. The router is
replicated: its gradient here comes from this rank's tokens (averaged by DDP like any
replicated parameter); an expert's gradient comes from every rank's tokens routed to it, summed
by the all-to-all's backward, so for the same loss averaged over the ranks it needs dividing by
the number of ranks whose tokens it saw (see ``course/ch13_experts/routing.sync_gradients``).

The forward runs three all-to-alls (the counts, the dispatch, the combine), the backward two
(the counts are known by then). ``.tolist()`` of the split sizes is a device-to-host sync on a
GPU; systems with fixed shapes pad to a capacity instead.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn as nn


def dispatch(rows: torch.Tensor, counts: torch.Tensor, group=None):
    """Send each row to the rank of its expert. ``rows`` are sorted by destination rank, then
    by that rank's local expert; ``counts[j, e]`` rows go to local expert ``e`` of rank ``j``.
    Returns ``(arrived, got)``: the rows received, by source rank then expert, and
    ``got[j, e]``, how many of them came from rank ``j`` for this rank's expert ``e``."""
    got = torch.empty_like(counts)
    dist.all_to_all_single(got, counts.contiguous(), group=group)  # the split sizes first
    arrived = rows.new_empty((int(got.sum()), *rows.shape[1:]))
    dist.all_to_all_single(arrived, rows.contiguous(), got.sum(1).tolist(),
                           counts.sum(1).tolist(), group=group)
    return arrived, got


def all_to_all(x, send_splits: list[int], recv_splits: list[int], group=None):
    """Rows ``x[sum(send_splits[:j]):...]`` go to rank j; returns the rows received, in rank
    order (``sum(recv_splits)`` of them)."""
    out = x.new_empty((sum(recv_splits), *x.shape[1:]))
    dist.all_to_all_single(out, x.contiguous(), recv_splits, send_splits, group=group)
    return out


class _Dispatch(torch.autograd.Function):
    """:func:`dispatch`; backward sends each row's gradient back where the row came from."""

    @staticmethod
    def forward(ctx, rows, counts, group):
        arrived, got = dispatch(rows, counts, group)
        ctx.splits, ctx.group = (counts.sum(1).tolist(), got.sum(1).tolist()), group
        ctx.mark_non_differentiable(got)
        return arrived, got

    @staticmethod
    def backward(ctx, grad, _):
        sent, received = ctx.splits
        return all_to_all(grad.contiguous(), received, sent, ctx.group), None, None


class _Combine(torch.autograd.Function):
    """The reverse trip: results go back to the ranks their rows came from."""

    @staticmethod
    def forward(ctx, done, sent, received, group):
        ctx.splits, ctx.group = (sent, received), group
        return all_to_all(done, received, sent, group)

    @staticmethod
    def backward(ctx, grad):
        sent, received = ctx.splits
        return all_to_all(grad.contiguous(), sent, received, ctx.group), None, None, None


@dataclass
class RouterStats:
    """One forward's routing on this rank: assignments each expert was asked for, how many it
    kept (at most ``capacity``), and ``dropped = requested - kept`` in total."""

    requested: list[int]
    kept: list[int]
    capacity: int | None

    @property
    def dropped(self) -> int:
        return sum(self.requested) - sum(self.kept)


def _expert(d_model: int, d_hidden: int) -> nn.Sequential:
    return nn.Sequential(nn.Linear(d_model, d_hidden), nn.GELU(), nn.Linear(d_hidden, d_model))


def expert_with_seed(d_model: int, d_hidden: int, seed: int) -> nn.Sequential:
    """One expert, initialised from ``seed`` alone (the global RNG is left as it was)."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return _expert(d_model, d_hidden)


def keep_within_capacity(expert_of: torch.Tensor, n_experts: int, capacity: int | None):
    """A mask over (token, slot) assignments: the first ``capacity`` per expert, first
    choices before second choices, each in token order."""
    if capacity is None:
        return torch.ones_like(expert_of, dtype=torch.bool)
    slot_major = expert_of.t().reshape(-1)
    one_hot = nn.functional.one_hot(slot_major, n_experts)
    position = (one_hot.cumsum(0) * one_hot).sum(-1) - 1  # place in its expert's queue
    return (position < capacity).reshape(expert_of.t().shape).t()


class MoE(nn.Module):
    def __init__(self, d_model: int, d_hidden: int, n_experts: int, top_k: int = 2,
                 capacity_factor: float | None = None, group=None):
        super().__init__()
        world, rank = dist.get_world_size(group), dist.get_rank(group)
        if n_experts % world:
            raise ValueError(f"{n_experts} experts do not split over {world} ranks: choose "
                             "n_experts divisible by the world size")
        if not 1 <= top_k <= n_experts:
            raise ValueError(f"top_k={top_k} must be between 1 and n_experts={n_experts}")
        self.n_experts, self.top_k, self.capacity_factor, self.group = n_experts, top_k, capacity_factor, group
        self.world, self.local = world, n_experts // world
        self.router = nn.Linear(d_model, n_experts, bias=False)
        # One seed drawn from the global RNG (the same on every rank seeded alike), then each
        # expert built from its own seed: a rank builds only its own experts, and expert e has
        # the same weights on any number of ranks, never holding the whole layer at once.
        self.expert_seed = int(torch.randint(2 ** 62, (), dtype=torch.int64))
        self.first_expert = rank * self.local
        self.experts = nn.ModuleList(
            expert_with_seed(d_model, d_hidden, self.expert_seed + e)
            for e in range(self.first_expert, self.first_expert + self.local))
        self.stats: RouterStats | None = None
        self.aux_loss: torch.Tensor | None = None

    def capacity(self, tokens: int) -> int | None:
        if self.capacity_factor is None:
            return None
        return math.ceil(self.capacity_factor * tokens * self.top_k / self.n_experts)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.world > 1:
            self._refuse_ddp_over_experts()
        flat = x.reshape(-1, x.shape[-1])
        probs = self.router(flat).softmax(dim=-1)
        gate, expert_of = probs.topk(self.top_k, dim=-1)          # (tokens, top_k)
        keep = keep_within_capacity(expert_of, self.n_experts, self.capacity(len(flat)))
        self._record(probs, expert_of, keep, len(flat))
        token, slot = keep.nonzero(as_tuple=True)
        experts = expert_of[token, slot]
        order = torch.argsort(experts, stable=True)               # grouped by expert, so by rank
        token, slot, experts = token[order], slot[order], experts[order]
        y = self._run_experts(flat[token], experts)
        out = torch.zeros_like(flat).index_add(0, token, y * gate[token, slot].unsqueeze(-1))
        return out.reshape(x.shape)

    def _refuse_ddp_over_experts(self) -> None:
        """Raise, before any all-to-all, when this forward runs inside a
        ``DistributedDataParallel`` whose process group holds two ranks of this layer's
        expert-parallel group and whose parameters include the experts. The experts differ
        from rank to rank with the same shapes, so DDP's construction accepted them
        (``_verify_param_shape_across_processes`` compares shapes only) and then broadcast
        rank 0's parameters over every rank's (``_sync_module_states``): the experts are
        already rank 0's on every rank, and each backward would average different experts'
        gradients. Every rank of the expert-parallel group sees the same DDP and raises. The
        check sees DDP's forward (``DistributedDataParallel._get_active_ddp_module``, the C++
        reducer's path); a compiled DDP with its Python reducer goes unseen."""
        from torch.nn.parallel import DistributedDataParallel

        ddp = DistributedDataParallel._get_active_ddp_module()
        if ddp is None:
            return
        mine = {id(p) for p in self.experts.parameters()}
        if not any(id(p) in mine for p in getattr(ddp, "_module_parameters", ())):
            return   # the experts are left out of this DDP (parameters to ignore)
        ddp_ranks = set(dist.get_process_group_ranks(ddp.process_group))
        ep_ranks = set(dist.get_process_group_ranks(self.group or dist.group.WORLD))
        if len(ddp_ranks & ep_ranks) > 1:
            raise RuntimeError(
                f"scratch.MoE is inside DistributedDataParallel over ranks {sorted(ddp_ranks)}, "
                f"which hold different experts (expert-parallel ranks {sorted(ep_ranks)}): DDP's "
                "construction has already copied rank 0's experts over every rank's, and its "
                "backward would average different experts' gradients. Rebuild the layer and keep "
                "its experts out of that DDP: wrap only the replicated part (the router) in DDP, "
                "or pass the experts' names to DistributedDataParallel."
                "_set_params_and_buffers_to_ignore_for_model(model, names) before wrapping; then "
                "reduce each expert's gradient over its data-parallel group by hand "
                "(course/ch13_experts/routing.sync_gradients)")

    def _run_experts(self, rows: torch.Tensor, experts: torch.Tensor) -> torch.Tensor:
        """Dispatch ``rows`` (sorted by expert) to their experts' ranks, run them, combine."""
        counts = torch.bincount(experts, minlength=self.n_experts).reshape(self.world, self.local)
        arrived, got = _Dispatch.apply(rows, counts, self.group)
        local_expert = torch.repeat_interleave(
            torch.arange(self.local).repeat(self.world), got.reshape(-1))
        done = torch.zeros_like(arrived)
        for e, expert in enumerate(self.experts):
            mine = (local_expert == e).nonzero(as_tuple=True)[0]
            done = done.index_add(0, mine, expert(arrived[mine]))
        return _Combine.apply(done, counts.sum(1).tolist(), got.sum(1).tolist(), self.group)

    def _record(self, probs, expert_of, keep, tokens: int) -> None:
        requested = torch.bincount(expert_of.reshape(-1), minlength=self.n_experts)
        kept = torch.bincount(expert_of[keep], minlength=self.n_experts)
        self.stats = RouterStats(requested.tolist(), kept.tolist(), self.capacity(tokens))
        self.aux_loss = switch_aux_loss(probs, requested, self.top_k)


def switch_aux_loss(probs: torch.Tensor, requested: torch.Tensor, top_k: int) -> torch.Tensor:
    """Switch's load-balancing loss ``n_experts * sum_e f_e P_e``: f_e the share of the
    assignments that went to e (a count, no gradient), P_e the mean router probability of e.
    Exactly 1 when either f or P is uniform; usually, not always, above 1 under imbalance.
    Its gradient with respect to P_e is ``n_experts * f_e``. Zero (not NaN) with no tokens."""
    tokens, n_experts = probs.shape
    if tokens == 0:
        return probs.sum() * 0   # keeps the graph (a zero gradient) on a rank without tokens
    share = requested.to(probs.dtype) / (tokens * top_k)
    return n_experts * (share * probs.mean(dim=0)).sum()
