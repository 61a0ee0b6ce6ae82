"""ZeRO stage 3 (fully sharded data parallel) from the collectives, in the spirit of FSDP
(https://pytorch.org/docs/stable/distributed.fsdp.fully_shard.html).

Each rank keeps 1/world_size of every parameter: a flat fp32 shard (padded so that the
parameter splits evenly). The optimizer sees only the shards. Per module that owns
parameters (a "unit", here every such submodule):

- before its forward, ``all_gather_single`` rebuilds the full weights (cast to
  ``compute_dtype`` first, if given: half the bytes on the wire and in the matmul);
- after its forward the full weights are dropped. Autograd would keep them alive for
  backward, so a ``saved_tensors_hooks`` pair stores a small token instead and all-gathers
  the weight again when backward needs it
  (https://pytorch.org/docs/stable/autograd.html#hooks-for-saved-tensors);
- in backward, each full gradient is reduce-scattered (async): every rank receives the sum
  of only its own shard's gradient, divided by world_size (the average, as in DDP).
  ``sync_gradients()`` waits for them and sets each shard's ``.grad``: call it between
  ``backward()`` and ``optimizer.step()``.

``full_state_dict(model)`` gathers the full parameters back into an ordinary state dict.

A frozen parameter (``requires_grad=False``) gives a frozen shard: it is gathered for
forward, gets no gradient and is never reduce-scattered.

Like torch's ``fully_shard``, it neither casts buffers (``MixedPrecisionPolicy`` has no
buffer dtype) nor synchronizes them: every rank keeps its own buffers, so start every rank
from the same ones (the same seed), as the course's models do. Unlike ``fully_shard``, which
keeps each rank's rows of that rank's own copy, it broadcasts rank 0's parameters first.

What it leaves out, on purpose (torch's ``fully_shard`` does each):
- only a gathered weight itself is swapped for a token when autograd saves it (matched by
  its storage in ``_pack``); a tensor made from it with storage of its own (a cast under
  ``torch.autocast``, a ``.contiguous()`` copy) is saved whole until backward: memory, not
  correctness;
- each shard's ``.grad`` is set by ``sync_gradients()``, by hand: parameter hooks,
  ``torch.autograd.grad`` and an optimizer step inside backward do not see it;
- ``model.state_dict()`` holds the flat shards (``shards.0``, ...), not the module's names:
  ``full_state_dict`` is the way back to them;
- the all-gathers block and nothing is prefetched (notebook 10, section 7, measures what
  prefetching buys on a slow link).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F


@dataclass(frozen=True)
class ParamSpec:
    """Where a sharded parameter lives in the wrapped module, and its full shape."""

    name: str          # e.g. "0.weight", as in the unwrapped module's state dict
    module: nn.Module  # the submodule that owned it
    attr: str          # its attribute name there
    shape: torch.Size

    @property
    def numel(self) -> int:
        return self.shape.numel()


def padded_flat(tensor: torch.Tensor, world_size: int) -> torch.Tensor:
    """``tensor`` flattened and zero-padded to a multiple of ``world_size``: what a
    reduce-scatter or an all-gather into one tensor needs, equal parts on every rank
    (``reduce_scatter_single``'s input "is of size output tensor size times world size",
    torch/distributed/distributed_c10d.py). The zeros add nothing to a sum."""
    return F.pad(tensor.flatten(), (0, (-tensor.numel()) % world_size))


def shard_of(full: torch.Tensor, rank: int, world_size: int) -> torch.Tensor:
    """This rank's piece of ``full`` flattened and zero-padded to a multiple of world_size."""
    return padded_flat(full.detach(), world_size).chunk(world_size)[rank].clone()


def gather_full(shard: torch.Tensor, spec: ParamSpec, dtype: torch.dtype) -> torch.Tensor:
    """All-gather every rank's shard (in ``dtype``) and cut the padding off: the full weight."""
    piece = shard.detach().to(dtype)
    flat = torch.empty(piece.numel() * dist.get_world_size(), dtype=dtype)
    dist.all_gather_single(flat, piece)
    return flat[: spec.numel].view(spec.shape)


class _GatherParam(torch.autograd.Function):
    """Forward: the full weight from the shards. Backward: reduce-scatter its gradient,
    asynchronously; the wrapper collects the result in ``sync_gradients``."""

    @staticmethod
    def forward(ctx, shard, spec, dtype, wrapper):
        ctx.spec, ctx.wrapper = spec, wrapper
        return gather_full(shard, spec, dtype)

    @staticmethod
    def backward(ctx, grad_full):
        world = dist.get_world_size()
        flat = padded_flat(grad_full.float(), world)
        out = torch.empty(flat.numel() // world)
        work = dist.reduce_scatter_single(out, flat, async_op=True)
        ctx.wrapper.pending.append((ctx.spec.name, out, work))
        return None, None, None, None


class FSDP(nn.Module):
    """``FSDP(module, compute_dtype=None)``: a fully sharded copy of ``module`` (rank 0's
    weights, broadcast at construction). Train it like DDP, plus ``sync_gradients()``
    before ``optimizer.step()``; ``parameters()`` are this rank's fp32 shards."""

    def __init__(self, module: nn.Module, compute_dtype: torch.dtype | None = None):
        super().__init__()
        if compute_dtype is not None and not (isinstance(compute_dtype, torch.dtype)
                                              and compute_dtype.is_floating_point):
            raise TypeError(f"compute_dtype must be a floating torch.dtype such as "
                            f"torch.bfloat16, or None; got {compute_dtype!r}")
        self.module = module
        self.compute_dtype = compute_dtype or torch.float32
        self.specs: list[ParamSpec] = []
        self.shards = nn.ParameterList()
        self.pending: list = []
        self._gathered: dict[int, int] = {}  # storage address of a full weight -> spec index
        self._shard_parameters()

    def _shard_parameters(self) -> None:
        rank, world = dist.get_rank(), dist.get_world_size()
        all_params = list(self.module.named_parameters(remove_duplicate=False))
        if len({id(p) for _, p in all_params}) != len(all_params):
            raise ValueError("FSDP from scratch does not handle shared (tied) parameters; "
                             "untie them or use torch's fully_shard")
        for name, param in all_params:
            owner_name, _, attr = name.rpartition(".")
            owner = self.module.get_submodule(owner_name)
            dist.broadcast(param.data, src=0)  # every rank starts from rank 0's weights
            self.specs.append(ParamSpec(name, owner, attr, param.shape))
            # a frozen parameter stays frozen: its shard gets no gradient, and nothing is
            # reduce-scattered for it (nn.Parameter alone would make it trainable)
            self.shards.append(nn.Parameter(shard_of(param.float(), rank, world),
                                            requires_grad=param.requires_grad))
            del owner._parameters[attr]
            setattr(owner, attr, torch.empty(0))  # nothing full is kept between uses
        for unit in {spec.module for spec in self.specs}:
            unit.register_forward_pre_hook(self._gather_unit)
            unit.register_forward_hook(self._free_unit)

    def _unit_specs(self, unit: nn.Module):
        return [(i, spec) for i, spec in enumerate(self.specs) if spec.module is unit]

    def _gather_unit(self, unit, args):
        for i, spec in self._unit_specs(unit):
            full = _GatherParam.apply(self.shards[i], spec, self.compute_dtype, self)
            self._gathered[full.untyped_storage().data_ptr()] = i
            setattr(unit, spec.attr, full)

    def _free_unit(self, unit, args, output):
        for i, spec in self._unit_specs(unit):
            self._gathered.pop(getattr(unit, spec.attr).untyped_storage().data_ptr(), None)
            setattr(unit, spec.attr, torch.empty(0))

    def _pack(self, tensor: torch.Tensor):
        """A saved full weight becomes (spec index, view geometry); anything else stays."""
        index = self._gathered.get(tensor.untyped_storage().data_ptr())
        if index is None:
            return tensor
        return index, tensor.size(), tensor.stride(), tensor.storage_offset()

    def _unpack(self, packed):
        if isinstance(packed, torch.Tensor):
            return packed
        index, size, stride, offset = packed
        full = gather_full(self.shards[index], self.specs[index], self.compute_dtype)
        return full.as_strided(size, stride, offset)  # the same view autograd saved

    def forward(self, *args, **kwargs):
        if self.pending:
            raise RuntimeError("the previous backward's gradients were never collected: call "
                               "model.sync_gradients() after backward(), before step()")
        args, kwargs = _cast_floats((args, kwargs), self.compute_dtype)
        with torch.autograd.graph.saved_tensors_hooks(self._pack, self._unpack):
            output = self.module(*args, **kwargs)
        return _cast_floats(output, torch.float32)

    def sync_gradients(self) -> None:
        """Wait for every reduce-scatter of the last backward; set (or add to) the shards'
        ``.grad`` with the average over the ranks."""
        index = {spec.name: i for i, spec in enumerate(self.specs)}
        for name, out, work in self.pending:
            work.wait()
            shard = self.shards[index[name]]
            average = out / dist.get_world_size()
            shard.grad = average if shard.grad is None else shard.grad + average
        self.pending.clear()


def _cast_floats(tree, dtype: torch.dtype):
    """Floating tensors in a (nested) tuple/list/dict cast to ``dtype``; the rest untouched."""
    if isinstance(tree, torch.Tensor):
        return tree.to(dtype) if tree.is_floating_point() else tree
    if isinstance(tree, (tuple, list)):
        return type(tree)(_cast_floats(t, dtype) for t in tree)
    if isinstance(tree, dict):
        return {k: _cast_floats(v, dtype) for k, v in tree.items()}
    return tree


def full_state_dict(fsdp_model: FSDP) -> dict[str, torch.Tensor]:
    """{name: full fp32 tensor} with the unwrapped module's names, on every rank (a
    collective: every rank must call it); loads into the plain module with
    ``load_state_dict(..., strict=False)`` (buffers are the module's own, unsharded)."""
    if not isinstance(fsdp_model, FSDP):
        raise TypeError(f"full_state_dict needs a scratch FSDP model, got "
                        f"{type(fsdp_model).__name__}")
    return {spec.name: gather_full(shard, spec, torch.float32).clone()
            for spec, shard in zip(fsdp_model.specs, fsdp_model.shards)}
