"""Notebook 09's exercises: process groups per node, and a hierarchical all-reduce on them.

The ranks are laid out as nodes of ``local_world_size`` consecutive ranks (torchrun's
``GROUP_RANK = RANK // LOCAL_WORLD_SIZE``). While the learner's code runs every collective
is watched: a collective on the default (all-ranks) group is refused, and each call's group
is recorded, so the checker sees which ranks talked to which: a per-node sum must stay
inside each node, and the hierarchical all-reduce may cross nodes only between the nodes'
first ranks. Values are random (a fresh seed per check); answers are compared with torch's
all_reduce over the same values.
"""

from __future__ import annotations

import contextlib

import torch
import torch.distributed as dist

from ddp_lab.exercises.builtins_off import BuiltinSwitchedOff, replaced
from ddp_lab.exercises.driver import generator, new_seed, run_ranks, tensor_problem
from ddp_lab.exercises.driver import where as on
from ddp_lab.exercises.registry import Exercise, ExerciseFailed

LAYOUTS = ((1, 1), (2, 1), (3, 1), (4, 2))  # (world size, ranks per node)
WATCHED = ("all_reduce", "reduce", "broadcast", "all_gather", "all_gather_into_tensor",
           "gather", "scatter", "reduce_scatter", "reduce_scatter_tensor", "all_to_all",
           "all_gather_object", "broadcast_object_list")
HANG_HINT = ("dist.new_group is a collective: every rank must create every group, in the "
             "same order, even the groups it is not in.")


@contextlib.contextmanager
def watching_groups():
    """Inside the block, collectives on the default group refuse; the others run and
    append (name, ranks of their group) to the list this yields."""
    calls: list[tuple[str, list[int]]] = []
    with contextlib.ExitStack() as stack:
        for name in WATCHED:
            stack.enter_context(replaced(dist, name, _watched(name, getattr(dist, name),
                                                              calls)))
        yield calls


def _watched(name: str, original, calls: list):
    def call(*args, group=None, **kwargs):
        if group is None or group is dist.group.WORLD:
            raise BuiltinSwitchedOff(
                f"dist.{name} on the default group (every rank) is switched off in this "
                "exercise: pass group= one of the groups you made with dist.new_group")
        calls.append((name, dist.get_process_group_ranks(group)))
        return original(*args, group=group, **kwargs)
    return call


# -- 09.node_sum ----------------------------------------------------------------------------
def node_sum(value: float, local_world_size: int) -> float:
    """Reference: one group per node; all_reduce the value inside this rank's node."""
    groups = [dist.new_group(list(range(first, first + local_world_size)))
              for first in range(0, dist.get_world_size(), local_world_size)]
    total = torch.tensor([float(value)], dtype=torch.float64)
    dist.all_reduce(total, group=groups[dist.get_rank() // local_world_size])
    return total.item()


def _node_sum_trial(fn, seed: int, local: int):
    rank, world = dist.get_rank(), dist.get_world_size()
    value = round(torch.rand((), generator=generator(seed, rank)).item() * 100, 3)
    with watching_groups() as calls:
        got = fn(value, local)
    everybody = [None] * world
    dist.all_gather_object(everybody, value)
    return got, everybody, calls


def layout_runs(trial, fn, seed: int):
    """(ranks per node, where, every rank's value) of ``trial`` on each layout."""
    for world, local in LAYOUTS:
        where = f"{on(world, seed)}, {local} per node"
        yield local, where, run_ranks(trial, world, (fn, seed, local), where=where,
                                      hang_hint=HANG_HINT)


def check_node_sum(fn) -> str:
    seed = new_seed()
    for local, where, values in layout_runs(_node_sum_trial, fn, seed):
        for rank, (got, everybody, _) in enumerate(values):
            node = rank // local
            expected = sum(everybody[node * local:(node + 1) * local])
            if not isinstance(got, (int, float)) or abs(got - expected) > 1e-9:
                raise ExerciseFailed(
                    f"{where}: the ranks held {everybody}; rank {rank} (node {node}) returned "
                    f"{got!r}, expected its node's sum {expected:.3f}. Node g holds ranks "
                    "g * L ... g * L + L - 1; all_reduce inside your node's group.")
    layouts = ", ".join(f"{w // l} node(s) of {l}" for w, l in LAYOUTS)
    return f"the right per-node sums on {layouts} (seed {seed})"


# -- 09.hierarchical_all_reduce -------------------------------------------------------------
def hierarchical_all_reduce(tensor: torch.Tensor, local_world_size: int) -> torch.Tensor:
    """Reference: reduce inside each node to its first rank (the fast links), all_reduce
    among the nodes' first ranks only (the slow links carry one tensor per node), then
    broadcast inside each node."""
    rank, world = dist.get_rank(), dist.get_world_size()
    nodes = [dist.new_group(list(range(first, first + local_world_size)))
             for first in range(0, world, local_world_size)]
    leaders = dist.new_group(list(range(0, world, local_world_size)))
    node, leader = rank // local_world_size, rank - rank % local_world_size
    result = tensor.clone()
    dist.reduce(result, dst=leader, group=nodes[node])
    if rank == leader:
        dist.all_reduce(result, group=leaders)
    dist.broadcast(result, src=leader, group=nodes[node])
    return result


def _hierarchical_trial(fn, seed: int, local: int):
    rank = dist.get_rank()
    tensor = torch.randint(-100, 100, (1 + seed % 4,), generator=generator(seed, rank))
    with watching_groups() as calls:
        got = fn(tensor.clone(), local)
    expected = tensor.clone()
    dist.all_reduce(expected)
    return got, expected, calls


def check_hierarchical_all_reduce(fn) -> str:
    seed = new_seed()
    for local, where, values in layout_runs(_hierarchical_trial, fn, seed):
        for rank, (got, expected, calls) in enumerate(values):
            problem = tensor_problem(got, expected)
            if problem:
                raise ExerciseFailed(f"{where}: rank {rank} should return the sum over all "
                                     f"ranks: {problem}")
            _check_crossings(where, rank, local, calls)
    return f"the all-reduced sum, nodes crossed only by their first ranks (seed {seed})"


def _check_crossings(where: str, rank: int, local: int, calls: list) -> None:
    for name, ranks in calls:
        crosses = len({r // local for r in ranks}) > 1
        if crosses and any(r % local for r in ranks):
            raise ExerciseFailed(
                f"{where}: rank {rank} called {name} on a group of ranks {ranks}, which spans "
                "nodes and holds ranks that are not their node's first. Between nodes only "
                "the nodes' first ranks (local rank 0) should talk: reduce inside the node "
                "first, all_reduce among the leaders, broadcast inside the node.")


EXERCISES = (
    Exercise(
        name="09.node_sum",
        notebook="09_torchrun_and_multinode",
        summary="node_sum(value, local_world_size): the sum of the values on this rank's node",
        hint="every rank creates every node's group: [dist.new_group(list(range(g * L, "
             "g * L + L))) for each node g]; all_reduce in groups[rank // L].",
        solution=node_sum,
        checker=check_node_sum,
    ),
    Exercise(
        name="09.hierarchical_all_reduce",
        notebook="09_torchrun_and_multinode",
        summary="my_all_reduce(tensor, local_world_size): the sum over all ranks, crossing "
                "nodes only between their first ranks",
        hint="node groups plus a group of the nodes' first ranks; dist.reduce to the leader "
             "in the node, all_reduce among leaders, dist.broadcast from the leader in the "
             "node.",
        solution=hierarchical_all_reduce,
        checker=check_hierarchical_all_reduce,
    ),
)
