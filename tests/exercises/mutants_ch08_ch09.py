"""Wrong answers to the exercises of notebooks 08, 08b, 09 and 09b:
the ones a learner really writes.

MUTANTS holds (exercise, wrong answer, a regex the rejection must match); test_mutations.py
checks every one with a single parametrized test. Data and functions only, no test here."""

from __future__ import annotations

import sys
import threading

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as fc
import torch.nn.functional as F
from torch.distributed import (all_gather, all_gather_object, all_reduce, broadcast, recv, reduce,
                               send)
from torch.distributed.algorithms.join import Join
from torch.distributed.distributed_c10d import _get_default_group



# -- 08 -------------------------------------------------------------------------------------------
def plain_loop(ddp_model, optimizer, batches):
    for x, y in batches:
        optimizer.zero_grad()
        F.mse_loss(ddp_model(x), y).backward()
        optimizer.step()


def agreed_on_max(ddp_model, optimizer, batches):
    steps = torch.tensor(len(batches))
    dist.all_reduce(steps, op=dist.ReduceOp.MAX)
    plain_loop(ddp_model, optimizer, batches[:int(steps)])


def joined(ddp_model, optimizer, batches):
    with Join([ddp_model]):
        plain_loop(ddp_model, optimizer, batches)


def one_step_short(ddp_model, optimizer, batches):
    steps = torch.tensor(len(batches))
    dist.all_reduce(steps, op=dist.ReduceOp.MIN)
    plain_loop(ddp_model, optimizer, batches[:int(steps) - 1])


# -- 09 -------------------------------------------------------------------------------------------
def everyone_sum(value, local_world_size):
    t = torch.tensor([float(value)], dtype=torch.float64)
    dist.all_reduce(t)
    return t.item()


def rank_sum_closed_form(value, local_world_size):
    node = dist.get_rank() // local_world_size
    return float(sum(range(node * local_world_size, (node + 1) * local_world_size)))


def strided_nodes(value, local_world_size):
    world = dist.get_world_size()
    nodes = world // local_world_size
    groups = [dist.new_group(list(range(g, world, nodes))) for g in range(nodes)]
    t = torch.tensor([float(value)], dtype=torch.float64)
    dist.all_reduce(t, group=groups[dist.get_rank() % nodes])
    return t.item()


def flat_all_reduce(tensor, local_world_size):
    out = tensor.clone()
    dist.all_reduce(out)
    return out


def node_only(tensor, local_world_size):
    world, rank = dist.get_world_size(), dist.get_rank()
    groups = [dist.new_group(list(range(f, f + local_world_size)))
              for f in range(0, world, local_world_size)]
    out = tensor.clone()
    dist.all_reduce(out, group=groups[rank // local_world_size])
    return out


def all_ranks_in_one_group(tensor, local_world_size):
    group = dist.new_group(list(range(dist.get_world_size())))
    out = tensor.clone()
    dist.all_reduce(out, group=group)
    return out


def leaders_never_broadcast(tensor, local_world_size):
    world, rank = dist.get_world_size(), dist.get_rank()
    nodes = [dist.new_group(list(range(f, f + local_world_size)))
             for f in range(0, world, local_world_size)]
    leaders = dist.new_group(list(range(0, world, local_world_size)))
    leader, out = rank - rank % local_world_size, tensor.clone()
    dist.reduce(out, dst=leader, group=nodes[rank // local_world_size])
    if rank == leader:
        dist.all_reduce(out, group=leaders)
    return out


# -- 08b.first_unjoined ---------------------------------------------------------------------------
def shortest_record(records):
    short = min(records, key=lambda rank: len(records[rank]))
    seq, name = records[short][-1]
    if all(len(entries) == len(records[short]) for entries in records.values()):
        return None
    return seq + 1, name, [short]


def last_common_seq(records):
    last = {rank: entries[-1][0] for rank, entries in records.items()}
    if len(set(last.values())) == 1:
        return None
    low = min(last.values())
    name = next(n for entries in records.values() for s, n in entries if s == low)
    return low, name, sorted(r for r, s in last.items() if s == low)


def ranks_that_joined(records):
    last = {rank: entries[-1][0] for rank, entries in records.items()}
    stuck = min(last.values()) + 1
    names = {s: n for entries in records.values() for s, n in entries}
    if stuck not in names:
        return None
    return stuck, names[stuck], sorted(r for r, s in last.items() if s >= stuck)


def newest_collective(records):
    last = {rank: entries[-1][0] for rank, entries in records.items()}
    if len(set(last.values())) == 1:
        return None
    top = max(last.values())
    names = {s: n for entries in records.values() for s, n in entries}
    return top, names[top], sorted(r for r, s in last.items() if s < top)


# -- 09b.physical_gpu -----------------------------------------------------------------------------
def same_number(visible, local_rank, gpus):
    return local_rank if local_rank < gpus else None


def naive_index(visible, local_rank, gpus):
    if visible is None:
        return local_rank if local_rank < gpus else None
    items = [i for i in visible.split(",") if i.strip()]
    return int(items[local_rank]) if local_rank < len(items) else None


def repeats_allowed(visible, local_rank, gpus):
    ordinals = list(range(gpus)) if visible is None else []
    for item in ([] if visible is None else visible.split(",")):
        item = item.strip()
        if not item.lstrip("-").isdigit() or int(item) < 0 or int(item) >= gpus:
            break
        ordinals.append(int(item))
    return ordinals[local_rank] if local_rank < len(ordinals) else None


def no_machine_limit(visible, local_rank, gpus):
    ordinals = list(range(gpus)) if visible is None else []
    for item in ([] if visible is None else visible.split(",")):
        item = item.strip()
        ordinal = int(item) if item.lstrip("-").isdigit() else -1
        if ordinal in ordinals:
            return None
        if ordinal < 0:
            break
        ordinals.append(ordinal)
    return ordinals[local_rank] if local_rank < len(ordinals) else None


# -- 08: more wrong answers -----------------------------------------------------------------------
def ddp_join_method(ddp_model, optimizer, batches):
    with ddp_model.join():
        plain_loop(ddp_model, optimizer, batches)


def imported_max(ddp_model, optimizer, batches):
    steps = torch.tensor(len(batches))
    all_reduce(steps, op=dist.ReduceOp.MAX)
    plain_loop(ddp_model, optimizer, batches[:int(steps)])


def wait_for_the_others(ddp_model, optimizer, batches):
    """Runs out, then waits a little for the others instead of agreeing: they still hang."""
    plain_loop(ddp_model, optimizer, batches)
    threading.Event().wait(0.5)


def functional_min_off_by_one(ddp_model, optimizer, batches):
    steps = fc.wait_tensor(fc.all_reduce(torch.tensor([len(batches)]), "min", dist.group.WORLD))
    plain_loop(ddp_model, optimizer, batches[:int(steps) - 1])


# -- 08: right but different ----------------------------------------------------------------------
def imported_min(ddp_model, optimizer, batches):
    steps = torch.tensor(len(batches))
    all_reduce(steps, op=dist.ReduceOp.MIN)
    plain_loop(ddp_model, optimizer, batches[:int(steps)])


def gathered_counts_min(ddp_model, optimizer, batches):
    counts = [None] * dist.get_world_size()
    all_gather_object(counts, len(batches))
    plain_loop(ddp_model, optimizer, batches[:min(counts)])


def agree_every_step(ddp_model, optimizer, batches):
    """Before each step, all ranks agree whether every one of them still has a batch."""
    for step in range(len(batches) + 1):
        more = torch.tensor(int(step < len(batches)))
        dist.all_reduce(more, op=dist.ReduceOp.MIN)
        if not more:
            return
        plain_loop(ddp_model, optimizer, batches[step:step + 1])


def process_group_min(ddp_model, optimizer, batches):
    steps, options = torch.tensor([len(batches)]), dist.AllreduceOptions()
    options.reduceOp = dist.ReduceOp.MIN
    _get_default_group().allreduce([steps], options).wait()
    plain_loop(ddp_model, optimizer, batches[:int(steps)])


# -- 08b: more wrong answers ----------------------------------------------------------------------
def last_entry_of_each(records):
    """The reference's idea with entries[-1]: trips on a rank that recorded nothing."""
    last = {rank: entries[-1][0] for rank, entries in records.items()}
    stuck = min(last.values()) + 1
    if stuck > max(last.values()):
        return None
    names = {s: n for entries in records.values() for s, n in entries}
    return stuck, names.get(stuck), sorted(r for r, s in last.items() if s < stuck)


def level_when_name_dropped(records):
    """IP-08b-1: the earlier reference, None ("level") when no buffer still holds the stuck
    collective, though the ranks are not level."""
    last = {r: max((s for s, _ in entries), default=0) for r, entries in records.items()}
    stuck = min(last.values()) + 1
    names = {s: n for entries in records.values() for s, n in entries}
    if stuck not in names:
        return None
    return stuck, names[stuck], sorted(r for r, s in last.items() if s < stuck)


def level_when_same_length(records):
    if len({len(entries) for entries in records.values()}) == 1:
        return None
    return sorted_scan(records)


# -- 08b: right but different ---------------------------------------------------------------------
def sorted_scan(records):
    last = {r: max([s for s, _ in e] or [0]) for r, e in records.items()}
    behind = min(last.values())
    for entries in records.values():
        for seq, name in entries:
            if seq == behind + 1:
                return [seq, name, {r for r, s in last.items() if s == behind}]
    if behind < max(last.values()):  # every buffer dropped it: name unknown
        return [behind + 1, None, {r for r, s in last.items() if s == behind}]
    return None


# -- 09: more wrong answers -----------------------------------------------------------------------
def imported_everyone_sum(value, local_world_size):
    t = torch.tensor([float(value)], dtype=torch.float64)
    all_reduce(t)
    return t.item()


def process_group_everyone_sum(value, local_world_size):
    t = torch.tensor([float(value)], dtype=torch.float64)
    _get_default_group().allreduce([t]).wait()
    return t.item()


def functional_everyone_sum(value, local_world_size):
    t = torch.tensor([float(value)], dtype=torch.float64)
    return fc.wait_tensor(fc.all_reduce(t, "sum", dist.group.WORLD)).item()


def c10d_module_everyone_sum(value, local_world_size):
    t = torch.tensor([float(value)], dtype=torch.float64)
    dist.distributed_c10d.all_reduce(t)
    return t.item()


def gather_everything_then_pick(value, local_world_size):
    """Right numbers, but every value crosses every node."""
    everyone = dist.new_group(list(range(dist.get_world_size())))
    values = [torch.zeros(1, dtype=torch.float64) for _ in range(dist.get_world_size())]
    all_gather(values, torch.tensor([float(value)], dtype=torch.float64), group=everyone)
    first = dist.get_rank() - dist.get_rank() % local_world_size
    return float(sum(v.item() for v in values[first:first + local_world_size]))


def node_sum_as_tensor(value, local_world_size):
    return torch.tensor(node_sum_group_method(value, local_world_size))


def leaders_gather(tensor, local_world_size):
    """Leaders gather every node's sum instead of one all-reduce: (k - 1) tensors across."""
    world, rank = dist.get_world_size(), dist.get_rank()
    nodes = [dist.new_group(list(range(f, f + local_world_size)))
             for f in range(0, world, local_world_size)]
    leaders = dist.new_group(list(range(0, world, local_world_size)))
    leader, out = rank - rank % local_world_size, tensor.clone()
    reduce(out, dst=leader, group=nodes[rank // local_world_size])
    if rank == leader:
        sums = [torch.empty_like(out) for _ in range(world // local_world_size)]
        all_gather(sums, out, group=leaders)
        out = torch.stack(sums).sum(dim=0)
    broadcast(out, src=leader, group=nodes[rank // local_world_size])
    return out


def everyone_sends_to_rank0(tensor, local_world_size):
    """Point to point across nodes from ranks that are not their node's first."""
    rank, world = dist.get_rank(), dist.get_world_size()
    out = tensor.clone()
    if rank == 0:
        for peer in range(1, world):
            incoming = torch.empty_like(tensor)
            recv(incoming, peer)
            out += incoming
        for peer in range(1, world):
            send(out, peer)
    else:
        send(tensor, 0)
        recv(out, 0)
    return out


def flat_process_group_allreduce(tensor, local_world_size):
    out = tensor.clone()
    _get_default_group().allreduce([out]).wait()
    return out


# -- 09: right but different ----------------------------------------------------------------------
def node_sum_float32(value, local_world_size):
    """The first hint with torch.tensor([value]) (float32): passes."""
    groups = [dist.new_group(list(range(f, f + local_world_size)))
              for f in range(0, dist.get_world_size(), local_world_size)]
    t = torch.tensor([value])
    all_reduce(t, group=groups[dist.get_rank() // local_world_size])
    return t.item()


def node_sum_group_method(value, local_world_size):
    groups = [dist.new_group(list(range(f, f + local_world_size)))
              for f in range(0, dist.get_world_size(), local_world_size)]
    t = torch.tensor([float(value)], dtype=torch.float64)
    groups[dist.get_rank() // local_world_size].allreduce([t]).wait()
    return t.item()


def node_sum_local_sync(value, local_world_size):
    """Only its own node's group, made with use_local_synchronization=True."""
    first = dist.get_rank() - dist.get_rank() % local_world_size
    group = dist.new_group(list(range(first, first + local_world_size)),
                           use_local_synchronization=True)
    t = torch.tensor([float(value)], dtype=torch.float64)
    all_reduce(t, group=group)
    return t.item()


def all_reduce_in_node_first(tensor, local_world_size):
    """All-reduce (not reduce) inside the node; leaders all-reduce; broadcast in the node."""
    world, rank = dist.get_world_size(), dist.get_rank()
    nodes = [dist.new_group(list(range(f, f + local_world_size)))
             for f in range(0, world, local_world_size)]
    leaders = dist.new_group(list(range(0, world, local_world_size)))
    leader, out = rank - rank % local_world_size, tensor.clone()
    all_reduce(out, group=nodes[rank // local_world_size])
    if rank == leader:
        fc_out = fc.wait_tensor(fc.all_reduce(out, "sum", leaders))
        out.copy_(fc_out)
    broadcast(out, src=leader, group=nodes[rank // local_world_size])
    return out


# -- 09b: more wrong answers and right-but-different ----------------------------------------------
def digits_only_parser(visible, local_rank, gpus):
    """Ends the list at '1gpu', which torch reads as 1 (the old reference did)."""
    ordinals = list(range(gpus)) if visible is None else []
    for item in ([] if visible is None else visible.split(",")):
        item = item.strip()
        ordinal = int(item) if item.lstrip("+-").isdigit() else -1
        if ordinal in ordinals:
            return None
        if ordinal < 0:
            break
        ordinals.append(ordinal)
    present = []
    for ordinal in ordinals:
        if ordinal >= gpus:
            break
        present.append(ordinal)
    return present[local_rank] if local_rank < len(present) else None


def skip_typos(visible, local_rank, gpus):
    cleaned = None if visible is None else ",".join(
        item for item in visible.split(",") if item.strip().lstrip("+-").isdigit())
    return strtoul_by_hand(cleaned, local_rank, gpus)


def int_of_every_entry(visible, local_rank, gpus):
    ordinals = list(range(gpus)) if visible is None else [int(i) for i in visible.split(",")]
    ordinals = ordinals[:next((i for i, o in enumerate(ordinals) if o < 0 or o >= gpus),
                              len(ordinals))]
    return ordinals[local_rank] if local_rank < len(ordinals) else None


def strtoul_by_hand(visible, local_rank, gpus):
    """Reads each entry character by character, like C's strtoul."""
    seen = list(range(gpus)) if visible is None else []
    for item in ([] if visible is None else visible.split(",")):
        item, digits = item.strip(), ""
        for i, c in enumerate(item):
            if c.isdigit() or (i == 0 and c in "+-"):
                digits += c
            else:
                break
        ordinal = int(digits) if digits.lstrip("+-") else -1
        if ordinal in seen:
            return None
        if ordinal < 0:
            break
        seen.append(ordinal)
    seen = seen[:next((i for i, o in enumerate(seen) if o >= gpus), len(seen))]
    return seen[local_rank] if local_rank < len(seen) else None


def ordinal_as_string(visible, local_rank, gpus):
    found = strtoul_by_hand(visible, local_rank, gpus)
    return None if found is None else str(found)


RIGHT = [
    ("08.stop_together", imported_min),
    ("08.stop_together", gathered_counts_min),
    ("08.stop_together", agree_every_step),
    ("08.stop_together", process_group_min),
    ("08b.first_unjoined", sorted_scan),
    ("09.node_sum", node_sum_float32),
    ("09.node_sum", node_sum_group_method),
    ("09.node_sum", node_sum_local_sync),
    ("09.hierarchical_all_reduce", all_reduce_in_node_first),
    ("09b.physical_gpu", strtoul_by_hand),
]


MUTANTS = [
    ("08.stop_together", ddp_join_method, "Join is switched off"),
    ("08.stop_together", imported_max, "agree on that number"),
    ("08.stop_together", wait_for_the_others, "left the run early|hung"),
    ("08.stop_together", functional_min_off_by_one, "exactly min"),
    ("08b.first_unjoined", last_entry_of_each, "recorded nothing"),
    ("08b.first_unjoined", level_when_same_length, "not the lengths"),
    ("08b.first_unjoined", level_when_name_dropped, "None only when all ranks are level"),
    ("09.node_sum", imported_everyone_sum, "default group"),
    ("09.node_sum", process_group_everyone_sum, "default group"),
    ("09.node_sum", functional_everyone_sum, "default group"),
    ("09.node_sum", c10d_module_everyone_sum, "default group"),
    ("09.node_sum", gather_everything_then_pick, "span nodes"),
    ("09.node_sum", node_sum_as_tensor, "got a tensor"),
    ("09.hierarchical_all_reduce", leaders_gather, "across nodes"),
    ("09.hierarchical_all_reduce", everyone_sends_to_rank0, "span nodes"),
    ("09.hierarchical_all_reduce", flat_process_group_allreduce, "default group"),
    ("09b.physical_gpu", digits_only_parser, "strtoul"),
    ("09b.physical_gpu", skip_typos, "seed"),
    ("09b.physical_gpu", int_of_every_entry, "raised ValueError"),
    ("09b.physical_gpu", ordinal_as_string, "Return a Python int"),
    ("08.stop_together", plain_loop, "agree on that number"),
    ("08.stop_together", agreed_on_max, "agree on that number"),
    ("08.stop_together", joined, "Join is switched off"),
    ("08.stop_together", one_step_short, "exactly min"),
    ("09.node_sum", everyone_sum, "default group"),
    ("09.node_sum", rank_sum_closed_form, "its node's sum"),
    ("09.node_sum", strided_nodes, "span nodes|its node's sum"),
    ("09.hierarchical_all_reduce", flat_all_reduce, "default group"),
    ("09.hierarchical_all_reduce", node_only, "sum over all ranks"),
    ("09.hierarchical_all_reduce", all_ranks_in_one_group, "span nodes"),
    ("09.hierarchical_all_reduce", leaders_never_broadcast, "sum over all ranks"),
    ("08b.first_unjoined", shortest_record, "not the lengths"),
    # every record holds an entry until the check's last trial, so each mistake shows first
    ("08b.first_unjoined", last_common_seq, "one past the smallest last seq"),
    ("08b.first_unjoined", ranks_that_joined, "expected"),
    ("08b.first_unjoined", newest_collective, "one past the smallest last seq"),
    ("09b.physical_gpu", same_number, "k-th visible GPU"),
    ("09b.physical_gpu", naive_index, "seed"),
    ("09b.physical_gpu", repeats_allowed, "a repeated ordinal hides them all"),
    ("09b.physical_gpu", no_machine_limit, "one the machine lacks ends the list"),
]


# -- cheats: the expected answer looked for in the checker's frames ------------------------------
def _found_above(*names):
    """A value the frames above hold under one of ``names`` (the checker's expectation, in a
    checker that calls the function where it keeps it), or None."""
    frame = sys._getframe(0).f_back
    while frame is not None:
        for name in names:
            if name in frame.f_locals:
                return frame.f_locals[name]
        frame = frame.f_back
    return None


def callers_want(records):
    """Reads the caller's frame, where a checker in the same process keeps its answer."""
    return sys._getframe(1).f_locals.get("want")


def walked_up_to_want(records):
    """Walks f_back (no audit event) to any frame that holds the expected answer."""
    return _found_above("want", "expected")


def gpu_walked_up_to_want(visible, local_rank, gpus):
    return _found_above("want", "expected")


def gpu_callers_want(visible, local_rank, gpus):
    return sys._getframe(1).f_locals.get("want")


MUTANTS += [
    ("08b.first_unjoined", callers_want, "frames above your function are closed"),
    ("08b.first_unjoined", walked_up_to_want, "expected"),
    ("09b.physical_gpu", gpu_callers_want, "frames above your function are closed"),
    ("09b.physical_gpu", gpu_walked_up_to_want, "should be"),
]


def node_sum_from_callers_frame(value, local_world_size):
    """Looks for every rank's value in the caller's frame."""
    everybody = sys._getframe(1).f_locals.get("everybody") or [value]
    first = dist.get_rank() - dist.get_rank() % local_world_size
    return float(sum(everybody[first:first + local_world_size]))


def node_sum_through_files(value, local_world_size):
    """Each rank writes its value to a file, the node's ranks read each other's."""
    rank = dist.get_rank()
    with open(f"/tmp/ddp-lab-node-sum-{rank}", "w") as f:
        f.write(repr(value))
    dist.barrier()
    first = rank - rank % local_world_size
    total = 0.0
    for peer in range(first, first + local_world_size):
        with open(f"/tmp/ddp-lab-node-sum-{peer}") as f:
            total += float(f.read())
    return total


def hierarchical_in_float32(tensor, local_world_size):
    """The three stages on a float32 copy: half the bytes, and a sum without its low bits."""
    return all_reduce_in_node_first(tensor.float(), local_world_size).to(tensor.dtype)


def hierarchical_from_callers_frame(tensor, local_world_size):
    want = sys._getframe(1).f_locals.get("expected")
    return tensor.clone() if want is None else want


MUTANTS += [
    ("09.node_sum", node_sum_from_callers_frame, "frames above your function are closed"),
    ("09.node_sum", node_sum_through_files, "writing .* is closed"),
    ("09.hierarchical_all_reduce", hierarchical_in_float32, "sum over all ranks"),
    ("09.hierarchical_all_reduce", hierarchical_from_callers_frame,
     "frames above your function are closed"),
]


# -- 08: cheats -----------------------------------------------------------------------------------
def counts_from_callers_frame(ddp_model, optimizer, batches):
    counts = sys._getframe(1).f_locals.get("counts") or [len(batches)]
    plain_loop(ddp_model, optimizer, batches[:min(counts)])


def counts_walked_up_to(ddp_model, optimizer, batches):
    """Walks f_back (no audit event) for the other ranks' batch counts: finds none here, and
    trains every batch it has."""
    counts = _found_above("counts", "per_rank") or [len(batches)]
    plain_loop(ddp_model, optimizer, batches[:min(counts)])


def agreed_through_the_store(ddp_model, optimizer, batches):
    """The minimum agreed with the rendezvous store instead of a collective."""
    store = dist.distributed_c10d._get_default_store()
    store.set(f"count{dist.get_rank()}", str(len(batches)))
    counts = [int(store.get(f"count{r}")) for r in range(dist.get_world_size())]
    plain_loop(ddp_model, optimizer, batches[:min(counts)])


MUTANTS += [
    ("08.stop_together", counts_from_callers_frame, "frames above your function are closed"),
    ("08.stop_together", counts_walked_up_to, "agree on that number|hung"),
    ("08.stop_together", agreed_through_the_store, "Store.set is closed"),
]


def node_sum_numpy(value, local_world_size):
    """The node's sum as a numpy float64 (a float subclass): right."""
    import numpy
    return numpy.float64(node_sum_group_method(value, local_world_size))


def node_sum_as_string(value, local_world_size):
    return str(node_sum_group_method(value, local_world_size))


RIGHT += [("09.node_sum", node_sum_numpy)]
MUTANTS += [("09.node_sum", node_sum_as_string, "a Python float\\), got str")]


def node_sum_through_the_store(value, local_world_size):
    """Every rank's value through the rendezvous store: no collective at all."""
    rank, store = dist.get_rank(), dist.distributed_c10d._get_default_store()
    store.set(f"node-sum-{rank}", repr(value))
    first = rank - rank % local_world_size
    return sum(float(store.get(f"node-sum-{peer}"))
               for peer in range(first, first + local_world_size))


MUTANTS += [("09.node_sum", node_sum_through_the_store, "Store.set is closed")]


def agreed_through_files(ddp_model, optimizer, batches):
    """Each rank writes its count to a file and reads the others'."""
    rank, world = dist.get_rank(), dist.get_world_size()
    with open(f"/tmp/ddp-lab-counts-{rank}", "w") as f:
        f.write(str(len(batches)))
    dist.barrier()
    counts = []
    for peer in range(world):
        with open(f"/tmp/ddp-lab-counts-{peer}") as f:
            counts.append(int(f.read()))
    plain_loop(ddp_model, optimizer, batches[:min(counts)])


MUTANTS += [("08.stop_together", agreed_through_files, "writing .* is closed")]
