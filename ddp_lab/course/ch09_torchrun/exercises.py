"""Notebook 09's exercises: process groups per node, and a hierarchical all-reduce on them.

The ranks are laid out as nodes of ``local_world_size`` consecutive ranks (torchrun's
``GROUP_RANK = RANK // LOCAL_WORLD_SIZE``), in several layouts on every check (2 nodes of 2,
2 of 3, 3 of 2, 3 of 1). While the learner's code runs every collective is watched at the
dispatcher (:class:`GroupTrace`), so an imported name, ``distributed_c10d.X``, a process-group
method and a functional collective are all seen: a collective on the default (all-ranks)
group is refused, and each call's group (a send's or recv's pair of ranks) and bytes are
recorded, so the checker sees which ranks talked to which and how much crossed nodes: a
per-node sum must stay inside each node; the hierarchical all-reduce may cross nodes only
between the nodes' first ranks, with no more bytes than one all-reduce among them. Values
are random (a fresh seed per check), made by the checker and dealt to the ranks (each sees
only its own); the expected sums are the checker's, computed over every rank's value. The
hierarchical all-reduce's values need all of int64's bits, so a sum sent in fewer bytes
(a narrower dtype) comes out wrong.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch.distributed.distributed_c10d import _get_default_group, _resolve_process_group
from torch.utils._pytree import tree_leaves

from ddp_lab.course.collective_trace import (FAMILY_OF, NAMESPACES, NOT_COLLECTIVES,
                                             BuiltinSwitchedOff, CollectiveTrace)
from ddp_lab.exercises.answers_in_a_rank import Other, plain
from ddp_lab.exercises.driver import each_world, generator, new_seed, number_problem
from ddp_lab.exercises.driver import tensor_problem
from ddp_lab.exercises.driver import where as on
from ddp_lab.exercises.registry import Exercise, ExerciseFailed
from ddp_lab.exercises.sealed import deal

LAYOUTS = ((4, 2), (6, 3), (6, 2), (3, 1))  # (world size, ranks per node)
HANG_HINT = ("dist.new_group is a collective: every rank must create every group, in the "
             "same order, even the groups it is not in.")
DEFAULT_OFF = ("pass group= one of the groups you made with dist.new_group (or call that "
               "group's own method)")
# dist.new_group is the exercise, and it agrees on the group through the store (a
# PrefixStore, Store.add): the seal lets torch's new_group reach the store, and nothing else.
NEW_GROUP_DOORS = ()
UNGROUPED = ("send", "recv", "barrier")  # point to point names its peer; a barrier moves nothing


class GroupTrace(CollectiveTrace):
    """A CollectiveTrace that refuses collectives on the default group and records, next to
    each call, the global ranks that took part: the group's, or for a send/recv this rank
    and its peer (``self.ranks``, parallel to ``self.calls``)."""

    def __init__(self):
        super().__init__()
        self.ranks: list[list[int]] = []
        self.moved: list[float] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.__name__.split(".")[0]
        family = FAMILY_OF.get(name)
        if (getattr(func, "namespace", "") in NAMESPACES and name not in NOT_COLLECTIVES
                and family not in UNGROUPED and self._is_default(func, args)):
            raise BuiltinSwitchedOff(f"dist.{family} on the default group (every rank) is "
                                     f"switched off in this exercise ({name} reached it): "
                                     f"{DEFAULT_OFF}")
        return super().__torch_dispatch__(func, types, args, kwargs)

    def _group(self, func, args):
        named = self._arguments(func, args)
        if "process_group" in named:
            return dist.ProcessGroup.unbox(named["process_group"])
        if "group_name" in named:
            return _resolve_process_group(named["group_name"])
        return None

    def _is_default(self, func, args) -> bool:
        group = self._group(func, args)
        return group is None or group.group_name == _get_default_group().group_name

    def _call(self, func, args, kwargs, out, functional: bool):
        call = super()._call(func, args, kwargs, out, functional)
        if call.peer is not None:
            self.ranks.append(sorted({dist.get_rank(), call.peer}))
        else:
            self.ranks.append(dist.get_process_group_ranks(self._group(func, args)))
        self.moved.append(self._moved(call, (*args, out)))
        return call

    def _moved(self, call, tensors) -> float:
        """The bytes this rank moved, as a ring algorithm moves them. The list forms count
        every tensor of the list (``all_gather(tensor_list, ...)`` concerns k tensors; the
        call record keeps the largest one only)."""
        if call.family in UNGROUPED:
            return call.bytes_per_rank
        whole = max((sum(t.numel() * t.element_size() for t in tree_leaves(arg)
                         if isinstance(t, torch.Tensor)) for arg in tensors), default=0)
        n = call.group_size
        return whole * (n - 1) / n * (2 if call.family == "all_reduce" else 1)

    def talks(self) -> list[tuple[str, list[int], float]]:
        """(family, ranks, bytes this rank moved) per call: plain data, to return."""
        return [(call.family, ranks, moved)
                for call, ranks, moved in zip(self.calls, self.ranks, self.moved)]


def nodes_of(ranks: list[int], local: int) -> set[int]:
    return {r // local for r in ranks}


def layout_runs(trial, fn, seed: int, draw):
    """(ranks per node, where, every rank's input, every rank's value) of ``trial`` on each
    layout. ``draw(seed, world, rank)`` makes a rank's input, here: each rank is dealt its
    own and never sees the check's seed, the others' inputs or the expected sums."""
    for world, local in LAYOUTS:
        where = f"{on(world, seed)}, {world // local} node(s) of {local}"
        inputs = [draw(seed, world, rank) for rank in range(world)]
        yield local, where, inputs, each_world(trial, (fn, deal(inputs), local), seed=seed,
                                               sizes=(world,), hang_hint=HANG_HINT,
                                               place=lambda n, where=where: where)[world]


# -- 09.node_sum ----------------------------------------------------------------------------
def node_sum(value: float, local_world_size: int) -> float:
    """Reference: one group per node; all_reduce the value inside this rank's node."""
    groups = [dist.new_group(list(range(first, first + local_world_size)))
              for first in range(0, dist.get_world_size(), local_world_size)]
    total = torch.tensor([float(value)], dtype=torch.float64)
    dist.all_reduce(total, group=groups[dist.get_rank() // local_world_size])
    return total.item()


def _node_sum_trial(fn, dealt, local: int):
    value = dealt.take()
    with GroupTrace() as trace:
        got = fn(value, local)
    return plain(got), trace.talks()


def _node_value(seed: int, world: int, rank: int) -> float:
    return round(torch.rand((), generator=generator(seed, world, rank)).item() * 100, 3)


def check_node_sum(fn) -> str:
    seed = new_seed()
    for local, where, everybody, values in layout_runs(_node_sum_trial, fn, seed, _node_value):
        for rank, (got, talks) in enumerate(values):
            node = rank // local
            expected = sum(everybody[node * local:(node + 1) * local])
            if isinstance(got, Other):
                raise ExerciseFailed(f"{where}, rank {rank}: expected the node's sum (a Python "
                                     f"float), got {got!r}")
            if isinstance(got, bool) or not isinstance(got, (int, float)):
                said = number_problem(got, expected, "the node's sum")
                raise ExerciseFailed(f"{where}, rank {rank}: {said}")
            for family, ranks, _ in talks:
                if len(nodes_of(ranks, local)) > 1:
                    raise ExerciseFailed(
                        f"{where}: rank {rank} called {family} with ranks {ranks}, which span "
                        "nodes. A node's sum needs no byte from another node: keep every "
                        "collective inside your node's group.")
            if abs(got - expected) > 1e-6 * max(1.0, abs(expected)):
                raise ExerciseFailed(
                    f"{where}: the ranks held {everybody}; rank {rank} (node {node}) returned "
                    f"{got!r}, expected its node's sum {expected:.3f}. Node g holds ranks "
                    "g * L ... g * L + L - 1; all_reduce inside your node's group.")
    layouts = ", ".join(f"{w // l} node(s) of {l}" for w, l in LAYOUTS)
    return f"the right per-node sums, inside the nodes, on {layouts} (seed {seed})"


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


def _hierarchical_trial(fn, dealt, local: int):
    tensor = dealt.take()
    with GroupTrace() as trace:
        got = fn(tensor, local)
    return plain(got), trace.talks()


def _full_bits(seed: int, world: int, rank: int) -> torch.Tensor:
    """int64 values that need all their bits: a sum moved in fewer bytes (int32, float32,
    float64 above 2**53) comes out wrong, so the right answer needs the bytes it moves."""
    return torch.randint(-2 ** 62 // 8, 2 ** 62 // 8, (1 + seed % 4,),
                         generator=generator(seed, world, rank))


def check_hierarchical_all_reduce(fn) -> str:
    seed = new_seed()
    for local, where, inputs, values in layout_runs(_hierarchical_trial, fn, seed, _full_bits):
        nodes, expected = len(values) // local, torch.stack(inputs).sum(0)
        for rank, ((got, talks), mine) in enumerate(zip(values, inputs)):
            problem = tensor_problem(got, expected, mine=mine)
            if problem:
                raise ExerciseFailed(f"{where}: rank {rank} should return the sum over all "
                                     f"ranks: {problem}")
            _check_crossings(where, rank, local, talks)
            _check_cross_bytes(where, rank, local, nodes, talks, expected)
    return (f"the all-reduced sum, nodes crossed only by their first ranks and with one "
            f"all-reduce's bytes (seed {seed})")


def _check_crossings(where: str, rank: int, local: int, talks: list) -> None:
    for family, ranks, _ in talks:
        if len(nodes_of(ranks, local)) > 1 and any(r % local for r in ranks):
            raise ExerciseFailed(
                f"{where}: rank {rank} called {family} with ranks {ranks}, which span "
                "nodes and hold ranks that are not their node's first. Between nodes only "
                "the nodes' first ranks (local rank 0) should talk: combine inside the node "
                "first, then among the leaders, then share inside the node.")


def _check_cross_bytes(where: str, rank: int, local: int, nodes: int, talks: list,
                       tensor: torch.Tensor) -> None:
    """What crossed nodes from this rank (per rank, as ring algorithms move it) against one
    all-reduce of the tensor among the nodes' leaders: 2 (k - 1) / k of it for k nodes."""
    crossed = sum(moved for _, ranks, moved in talks if len(nodes_of(ranks, local)) > 1)
    allowed = 2 * (nodes - 1) / nodes * tensor.numel() * tensor.element_size()
    if crossed > allowed + 1e-9:
        raise ExerciseFailed(
            f"{where}: rank {rank} moved {crossed:.0f} bytes across nodes; one all_reduce of "
            f"the node sums among the {nodes} leaders moves 2 (k - 1) / k of the "
            f"{tensor.numel() * tensor.element_size()}-byte tensor, {allowed:.0f} bytes. "
            "Gathering every node's sum on every leader (or sending it to each) costs "
            "(k - 1) tensors: the slow links are the ones to spare.")


EXERCISES = (
    Exercise(
        name="09.node_sum",
        notebook="09_torchrun_and_multinode",
        summary="node_sum(value, local_world_size): the sum of the values on this rank's node",
        hint="a process group per node, made with dist.new_group (a collective itself: "
             "every rank takes part in making every group, in the same order); then one "
             "collective inside your own node's group.",
        recipe="L = local_world_size; groups = [dist.new_group(list(range(first, first + "
               "L))) for first in range(0, dist.get_world_size(), L)]; t = "
               "torch.tensor([float(value)], dtype=torch.float64); dist.all_reduce(t, "
               "group=groups[dist.get_rank() // L]); return t.item().",
        solution=node_sum,
        checker=check_node_sum,
        open_doors=NEW_GROUP_DOORS,
    ),
    Exercise(
        name="09.hierarchical_all_reduce",
        notebook="09_torchrun_and_multinode",
        summary="my_all_reduce(tensor, local_world_size): the sum over all ranks, crossing "
                "nodes only between their first ranks",
        hint="three stages on three kinds of group: combine inside each node onto its first "
             "rank, combine across nodes among those first ranks only, then hand the result "
             "back inside each node. Every rank makes every group.",
        recipe="L = local_world_size; nodes = [dist.new_group(list(range(f, f + L))) for f "
               "in range(0, world, L)]; leaders = dist.new_group(list(range(0, world, L))); "
               "leader = rank - rank % L; result = tensor.clone(); dist.reduce(result, "
               "dst=leader, group=nodes[rank // L]); if rank == leader: "
               "dist.all_reduce(result, group=leaders); dist.broadcast(result, src=leader, "
               "group=nodes[rank // L]); return result.",
        solution=hierarchical_all_reduce,
        checker=check_hierarchical_all_reduce,
        open_doors=NEW_GROUP_DOORS,
    ),
)
