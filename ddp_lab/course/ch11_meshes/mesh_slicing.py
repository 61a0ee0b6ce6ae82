"""Notebook 11: taking a mesh apart and putting groups together.

``mesh["dp"]`` is the 1-D sub-mesh along one named dimension: the group of ranks that share
this rank's coordinate on every other dimension (DeviceMesh.__getitem__,
torch/distributed/device_mesh.py). ``mesh["dp", "cp"]._flatten()`` (a private method in torch
2.13, what torchtitan uses for a loss all-reduce over data and context parallel ranks at once)
makes the two dimensions one, of their product's size. ``DeviceMesh.from_group`` wraps a process
group made elsewhere (``dist.new_group``) as a 1-D mesh, so DTensor and FSDP2 can run on it.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh


def slices(shape: tuple[int, int] = (2, 2)) -> dict:
    """This rank's groups on a (dp, cp) mesh: each named slice, the flattened one, and a
    mesh made from a group of our own; each checked by an all-reduce of the ranks' numbers."""
    rank = dist.get_rank()
    mesh = init_device_mesh("cpu", shape, mesh_dim_names=("dp", "cp"))
    flat = mesh["dp", "cp"]._flatten()
    evens = dist.new_group([r for r in range(dist.get_world_size()) if r % 2 == 0])
    found = {"coordinate": mesh.get_coordinate(),
             "dp": _members(mesh["dp"]), "cp": _members(mesh["cp"]),
             "flat": _members(flat), "flat_size": flat.size()}
    if rank % 2 == 0:
        found["from_group"] = _members(DeviceMesh.from_group(evens, "cpu"))
    return found


def _members(mesh: DeviceMesh) -> list[int]:
    """Which global ranks a 1-D mesh's group holds, found by summing one-hot vectors."""
    one_hot = torch.zeros(dist.get_world_size())
    one_hot[dist.get_rank()] = 1.0
    dist.all_reduce(one_hot, group=mesh.get_group())
    return [r for r, present in enumerate(one_hot.tolist()) if present]
