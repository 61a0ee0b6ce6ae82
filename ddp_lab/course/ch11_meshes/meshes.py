"""A 2-D device mesh on 4 ranks (notebook 11): ``init_device_mesh("cpu", (2, 2),
mesh_dim_names=("dp", "tp"))`` lays the ranks out as a 2 x 2 grid
([[0, 1], [2, 3]]) and builds one process group per row and one per column
(https://pytorch.org/tutorials/recipes/distributed_device_mesh.html). Data parallel runs
along "dp" (ranks 0-2 and 1-3), tensor parallel along "tp" (ranks 0-1 and 2-3): on real
clusters "tp" stays inside a node, where the links are fastest.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh

from ddp_lab.course.collective_trace import CollectiveTrace

MESH_SHAPE = (2, 2)
DIM_NAMES = ("dp", "tp")


def make_mesh(shape=MESH_SHAPE, names=DIM_NAMES):
    if dist.get_world_size() != shape[0] * shape[1]:
        raise ValueError(f"a {shape[0]} x {shape[1]} mesh needs {shape[0] * shape[1]} ranks, "
                         f"this run has {dist.get_world_size()}")
    return init_device_mesh("cpu", shape, mesh_dim_names=names)


def mesh_groups() -> dict:
    """On each rank: the mesh, this rank's coordinate, and the ranks of its group along
    each dimension."""
    mesh = make_mesh()
    return {"mesh": mesh.mesh.tolist(), "coordinate": mesh.get_coordinate(),
            "groups": {name: dist.get_process_group_ranks(mesh.get_group(name))
                       for name in DIM_NAMES}}


def hierarchical_all_reduce() -> dict:
    """All-reduce ``10 ** rank`` along "tp" first, then along "dp": every rank ends with
    the sum over all 4 ranks, as one flat all-reduce gives, in two smaller steps (the
    traced calls show each one's group size). Then the bandwidth-saving form of a
    hierarchical all-reduce: reduce-scatter along "tp", all-reduce only this rank's shard
    along "dp", all-gather along "tp" (``rs_calls``): the "dp" hop moves 1/k of the bytes."""
    mesh = make_mesh()
    tp, dp = mesh.get_group("tp"), mesh.get_group("dp")
    mine = torch.full((4,), 10.0 ** dist.get_rank())
    hierarchical = mine.clone()
    with CollectiveTrace(dist.get_world_size()) as trace:
        dist.all_reduce(hierarchical, group=tp)
        after_tp = hierarchical.clone()
        dist.all_reduce(hierarchical, group=dp)
    shard = torch.empty(mine.numel() // dist.get_world_size(tp))
    rs_ar_ag = torch.empty_like(mine)
    with CollectiveTrace(dist.get_world_size()) as rs_trace:
        dist.reduce_scatter_single(shard, mine.clone(), group=tp)
        dist.all_reduce(shard, group=dp)
        dist.all_gather_single(rs_ar_ag, shard, group=tp)
    flat = mine.clone()
    dist.all_reduce(flat)
    return {"mine": mine, "after_tp": after_tp, "after_dp": hierarchical, "flat": flat,
            "rs_ar_ag": rs_ar_ag,
            "calls": [(c.name, c.nbytes, c.group_size) for c in trace.calls],
            "rs_calls": [(c.name, c.nbytes, c.group_size) for c in rs_trace.calls]}


def tour() -> dict:
    """Both of the above in one launch: the groups, then the hierarchical all-reduce."""
    return {**mesh_groups(), "all_reduce": hierarchical_all_reduce()}
