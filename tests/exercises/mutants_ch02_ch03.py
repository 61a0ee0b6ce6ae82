"""Wrong answers to the exercises of notebooks 02, 03 and 03b, the ones a learner really
writes, and right answers that differ from the reference.

MUTANTS holds (exercise, wrong answer, a regex the rejection must match); RIGHT holds
(exercise, right-but-different answer); test_mutations.py checks every one. Each class the
checkers must see through has its mutants: names imported at the top of this module (the
way a notebook imports them), process-group methods, functional collectives,
``distributed_c10d``, cost (bytes routed through one rank, stacked scatters, a loop of
all-reduces, a narrower or wider dtype, the store as a side channel) and the coverage holes
(buffers of the default dtype, a send to itself). Data and functions only, no test here."""

from __future__ import annotations

import io
import os
import sys
import tempfile
import time

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as fc
from torch.distributed import all_gather, all_reduce, all_to_all, irecv, isend, scatter
from torch.distributed import distributed_c10d



def _group():
    return distributed_c10d._get_default_group()


def _split_back(flat, tensors):
    return [p.view_as(t) for p, t in zip(flat.split([t.numel() for t in tensors]), tensors)]


def _flat(tensors):
    return torch.cat([t.reshape(-1) for t in tensors])


# -- 02.all_gather --------------------------------------------------------------------------
def builtin_all_gather(tensor):
    out = [torch.empty_like(tensor) for _ in range(dist.get_world_size())]
    dist.all_gather(out, tensor)
    return out


def imported_all_gather(tensor):
    out = [torch.empty_like(tensor) for _ in range(dist.get_world_size())]
    all_gather(out, tensor)
    return out


def group_allgather(tensor):
    out = [torch.empty_like(tensor) for _ in range(dist.get_world_size())]
    _group().allgather([out], [tensor]).wait()
    return out


def functional_all_gather(tensor):
    stacked = fc.all_gather_tensor(tensor.unsqueeze(0), 0, dist.group.WORLD).wait()
    return list(stacked.unbind(0))


def c10d_all_gather(tensor):
    out = [torch.empty_like(tensor) for _ in range(dist.get_world_size())]
    distributed_c10d.all_gather(out, tensor)
    return out


def my_own_everywhere(tensor):
    return [tensor.clone() for _ in range(dist.get_world_size())]


def ring_off_by_one(tensor):
    rank, world = dist.get_rank(), dist.get_world_size()
    gathered = [torch.empty_like(tensor) for _ in range(world)]
    gathered[rank] = tensor.clone()
    for step in range(world - 1):
        outgoing = gathered[(rank - step) % world]
        incoming = gathered[(rank + step + 1) % world]  # should be (rank - step - 1)
        for request in (dist.isend(outgoing, (rank + 1) % world),
                        dist.irecv(incoming, (rank - 1) % world)):
            request.wait()
    return gathered


def default_dtype_buffers(tensor):
    rank, world = dist.get_rank(), dist.get_world_size()
    out = [torch.empty(tensor.shape) for _ in range(world)]  # float32, whatever was sent
    out[rank] = tensor.clone()
    requests = []
    for j in range(world):
        if j != rank:
            requests += [isend(tensor, j), irecv(out[j], j)]
    for request in requests:
        request.wait()
    return out


def sent_as_int16(tensor):
    rank, world = dist.get_rank(), dist.get_world_size()
    small = tensor.to(torch.int16)
    out = [torch.empty_like(small) for _ in range(world)]
    out[rank] = small
    requests = []
    for j in range(world):
        if j != rank:
            requests += [isend(small, j), irecv(out[j], j)]
    for request in requests:
        request.wait()
    return [t.to(tensor.dtype) for t in out]


def through_rank0(tensor):
    rank, world = dist.get_rank(), dist.get_world_size()
    out = [torch.empty_like(tensor) for _ in range(world)]
    out[rank] = tensor.clone()
    if rank == 0:
        for j in range(1, world):
            dist.recv(out[j], j)
        for j in range(1, world):
            for i in range(world):
                dist.send(out[i], j)
    else:
        dist.send(tensor, 0)
        for i in range(world):
            dist.recv(out[i], 0)
    return out


def blocking_sends_first(tensor):
    rank, world = dist.get_rank(), dist.get_world_size()
    out = [torch.empty_like(tensor) for _ in range(world)]
    out[rank] = tensor.clone()
    for j in range(world):
        if j != rank:
            dist.send(tensor, j)
    for j in range(world):
        if j != rank:
            dist.recv(out[j], j)
    return out


def direct_exchange_batched(tensor):
    rank, world = dist.get_rank(), dist.get_world_size()
    out = [torch.empty_like(tensor) for _ in range(world)]
    out[rank] = tensor.clone()
    ops = [op for j in range(world) if j != rank
           for op in (dist.P2POp(dist.isend, tensor, j), dist.P2POp(dist.irecv, out[j], j))]
    for request in (dist.batch_isend_irecv(ops) if ops else []):
        request.wait()
    return out


def ring_with_imported_names(tensor):
    rank, world = dist.get_rank(), dist.get_world_size()
    gathered = [torch.empty_like(tensor) for _ in range(world)]
    gathered[rank] = tensor.clone()
    for step in range(world - 1):
        requests = [isend(gathered[(rank - step) % world], (rank + 1) % world),
                    irecv(gathered[(rank - step - 1) % world], (rank - 1) % world)]
        for request in requests:
            request.wait()
    return gathered


def tensors_in_the_callers_frames(tensor):
    """Every tensor of this tensor's shape and dtype that the frames above hold."""
    frame, seen = sys._getframe(0).f_back, []
    while frame is not None:
        for local in frame.f_locals.values():
            items = local if isinstance(local, (list, tuple)) else [local]
            seen += [t for t in items if isinstance(t, torch.Tensor) and t.shape == tensor.shape
                     and t.dtype == tensor.dtype]
        frame = frame.f_back
    out = [t.clone() for t in seen[:dist.get_world_size()]]
    return out + [tensor.clone()] * (dist.get_world_size() - len(out))


def _posted_file(tensor, tag):
    folder = os.path.join(tempfile.gettempdir(), f"{tag}-{os.getppid()}")
    os.makedirs(folder, exist_ok=True)
    torch.save(tensor, os.path.join(folder, str(dist.get_rank())))
    return folder


def garbage_sent_data_through_files(tensor):
    """A ring of the right size that carries zeros; the tensors themselves go through files."""
    rank, world = dist.get_rank(), dist.get_world_size()
    folder = _posted_file(tensor, "gather")
    garbage = torch.zeros_like(tensor)
    for _ in range(world - 1):
        for request in (isend(garbage, (rank + 1) % world), irecv(garbage, (rank - 1) % world)):
            request.wait()
    while len(os.listdir(folder)) < world:
        time.sleep(0.01)
    return [torch.load(os.path.join(folder, str(j))) for j in range(world)]


def gathered_through_the_store(tensor):
    store = distributed_c10d._get_default_store()
    buffer = io.BytesIO()
    torch.save(tensor, buffer)
    store.set(f"gather/{dist.get_rank()}", buffer.getvalue())
    return [torch.load(io.BytesIO(store.get(f"gather/{j}")))
            for j in range(dist.get_world_size())]


# -- 02.shift ---------------------------------------------------------------------------------
def shift_the_wrong_way(tensor, k):
    rank, world = dist.get_rank(), dist.get_world_size()
    if k % world == 0:
        return tensor.clone()
    got = torch.empty_like(tensor)
    for request in (isend(tensor, (rank - k) % world), irecv(got, (rank + k) % world)):
        request.wait()
    return got


def shift_nothing(tensor, k):
    return tensor.clone()


def shift_by_broadcast(tensor, k):
    return builtin_all_gather(tensor)[(dist.get_rank() - k) % dist.get_world_size()]


def shift_by_permute(tensor, k):
    world = dist.get_world_size()
    return fc.permute_tensor(tensor, [(r + k) % world for r in range(world)],
                             dist.group.WORLD).wait()


def shift_into_flat_floats(tensor, k):
    rank, world = dist.get_rank(), dist.get_world_size()
    if k % world == 0:
        return tensor.clone()
    received = torch.zeros(tensor.numel())
    for request in (isend(tensor, (rank + k) % world), irecv(received, (rank - k) % world)):
        request.wait()
    return received.view_as(tensor)


def shift_to_itself(tensor, k):
    rank, world = dist.get_rank(), dist.get_world_size()
    received = torch.empty_like(tensor)
    for request in (isend(tensor, (rank + k) % world), irecv(received, (rank - k) % world)):
        request.wait()
    return received


def shift_by_gathering_everything(tensor, k):
    return ring_with_imported_names(tensor)[(dist.get_rank() - k) % dist.get_world_size()]


def shift_through_a_file(tensor, k):
    rank, world = dist.get_rank(), dist.get_world_size()
    path = os.path.join(_posted_file(tensor, f"shift{k}"), str((rank - k) % world))
    while not os.path.exists(path):
        time.sleep(0.01)
    return torch.load(path)


def shift_even_ranks_send_first(tensor, k):
    rank, world = dist.get_rank(), dist.get_world_size()
    if k % world == 0:
        return tensor.clone()
    received = torch.empty_like(tensor)
    if rank % 2 == 0:
        dist.send(tensor, (rank + k) % world)
        dist.recv(received, (rank - k) % world)
    else:
        dist.recv(received, (rank - k) % world)
        dist.send(tensor, (rank + k) % world)
    return received


def shift_batched(tensor, k):
    rank, world = dist.get_rank(), dist.get_world_size()
    if k % world == 0:
        return tensor.clone()
    received = torch.empty_like(tensor)
    ops = [dist.P2POp(dist.irecv, received, (rank - k) % world),
           dist.P2POp(dist.isend, tensor, (rank + k) % world)]
    for request in dist.batch_isend_irecv(ops):
        request.wait()
    return received


# -- 03.all_to_all ----------------------------------------------------------------------------
def chunks_unchanged(chunks):
    return list(chunks)


def scattered_but_own_chunks_kept(chunks):
    """The N scatters made, and the chunks this rank started with handed back."""
    imported_scatter_downwards(chunks)
    return list(chunks)


def builtin_all_to_all(chunks):
    out = [torch.empty_like(c) for c in chunks]
    dist.all_to_all(out, list(chunks))
    return out


def imported_all_to_all(chunks):
    out = [torch.empty_like(c) for c in chunks]
    all_to_all(out, list(chunks))
    return out


def group_alltoall_base(chunks):
    flat = torch.stack(chunks)
    out = torch.empty_like(flat)
    _group().alltoall_base(out, flat, [], []).wait()
    return list(out.unbind(0))


def functional_all_to_all(chunks):
    out = fc.all_to_all_single(torch.stack(chunks), None, None, dist.group.WORLD).wait()
    return list(out.unbind(0))


def scatters_in_reverse(chunks):
    return imported_scatter_downwards(chunks)[::-1]


def garbage_scattered_chunks_through_files(chunks):
    """N scatters of the right size that carry zeros; the chunks go through files."""
    rank, world = dist.get_rank(), dist.get_world_size()
    folder = _posted_file(torch.stack(chunks), "a2a")
    for src in range(world):
        zeros = [torch.zeros_like(c) for c in chunks]
        scatter(torch.empty_like(chunks[0]), zeros if rank == src else None, src=src)
    while len(os.listdir(folder)) < world:
        time.sleep(0.01)
    return [torch.load(os.path.join(folder, str(i)))[rank] for i in range(world)]


def chunks_in_the_callers_frames(chunks):
    """Every list of chunks the frames above hold, taken as the other ranks' lists."""
    frame, lists = sys._getframe(0).f_back, []
    while frame is not None:
        lists += [v for v in frame.f_locals.values() if isinstance(v, list) and v
                  and all(isinstance(c, torch.Tensor) for c in v) and v is not chunks]
        frame = frame.f_back
    return [(lists[i] if i < len(lists) else chunks)[dist.get_rank()].clone()
            for i in range(dist.get_world_size())]


def through_the_store(chunks):
    store = distributed_c10d._get_default_store()
    rank, world = dist.get_rank(), dist.get_world_size()
    for j, chunk in enumerate(chunks):
        buffer = io.BytesIO()
        torch.save(chunk, buffer)
        store.set(f"a2a/{rank}/{j}", buffer.getvalue())
    return [torch.load(io.BytesIO(store.get(f"a2a/{i}/{rank}"))) for i in range(world)]


def stacked_scatters(chunks):
    rank, world = dist.get_rank(), dist.get_world_size()
    out = []
    for src in range(world):
        buffer = torch.empty((world, *chunks[0].shape), dtype=chunks[0].dtype)
        dist.scatter(buffer, [torch.stack(chunks)] * world if rank == src else None, src=src)
        out.append(buffer[rank])
    return out


def imported_scatter_downwards(chunks):
    rank, world = dist.get_rank(), dist.get_world_size()
    out = [torch.empty_like(chunks[0]) for _ in range(world)]
    for src in reversed(range(world)):
        scatter(out[src], list(chunks) if rank == src else None, src=src)
    return out


def group_scatter(chunks):
    rank, world = dist.get_rank(), dist.get_world_size()
    out = [torch.empty_like(chunks[0]) for _ in range(world)]
    for src in range(world):
        options = dist.ScatterOptions()
        options.rootRank = src
        _group().scatter([out[src]], [list(chunks)] if rank == src else [], options).wait()
    return out


# -- 03b.all_reduce_list --------------------------------------------------------------------
def summed_but_inputs_returned(tensors):
    """One all_reduce of a flat copy, and the inputs handed back instead of its parts."""
    dist.all_reduce(torch.cat([t.reshape(-1) for t in tensors]))
    return tensors


def one_all_reduce_each(tensors):
    for t in tensors:
        dist.all_reduce(t)
    return tensors


def imported_all_reduce_each(tensors):
    for t in tensors:
        all_reduce(t)
    return tensors


def group_allreduce_each(tensors):
    for t in tensors:
        _group().allreduce([t]).wait()
    return tensors


def functional_all_reduce_each(tensors):
    return [fc.all_reduce(t, "sum", dist.group.WORLD).wait() for t in tensors]


def c10d_all_reduce_each(tensors):
    for t in tensors:
        distributed_c10d.all_reduce(t)
    return tensors


def flat_sum_not_split_back(tensors):
    flat = _flat(tensors)
    dist.all_reduce(flat)
    return list(flat.split([t.numel() for t in tensors]))


def averaged_instead_of_summed(tensors):
    flat = _flat(tensors)
    dist.all_reduce(flat)
    flat /= dist.get_world_size()
    return _split_back(flat, tensors)


def gathered_then_summed(tensors):
    flat = _flat(tensors)
    out = [torch.empty_like(flat) for _ in range(dist.get_world_size())]
    dist.all_gather(out, flat)
    return _split_back(torch.stack(out).sum(dim=0), tensors)


def broadcasts_then_summed(tensors):
    flat = _flat(tensors)
    parts = [flat.clone() for _ in range(dist.get_world_size())]
    for src, part in enumerate(parts):
        dist.broadcast(part, src=src)
    return _split_back(torch.stack(parts).sum(dim=0), tensors)


def sent_as_half(tensors):
    flat = _flat(tensors).half()
    dist.all_reduce(flat)
    return _split_back(flat.to(tensors[0].dtype), tensors)


def widened_to_double(tensors):
    flat = _flat(tensors).double()
    dist.all_reduce(flat)
    return _split_back(flat.to(tensors[0].dtype), tensors)


def imported_one_all_reduce(tensors):
    flat = _flat(tensors)
    all_reduce(flat)
    return _split_back(flat, tensors)


def group_allreduce_once(tensors):
    flat = _flat(tensors)
    _group().allreduce([flat]).wait()
    return _split_back(flat, tensors)


def functional_once(tensors):
    flat = fc.all_reduce(_flat(tensors), "sum", dist.group.WORLD).wait()
    return _split_back(flat, tensors)


def all_but_the_last_reduced(tensors):
    """One all_reduce of fewer bytes than the list holds: the last tensor stays this rank's."""
    flat = _flat(tensors[:-1])
    dist.all_reduce(flat)
    return _split_back(flat, tensors[:-1]) + [tensors[-1]]


def zeros_reduced_sums_through_files(tensors):
    """One all_reduce of the right size that carries zeros; the lists go through files."""
    world = dist.get_world_size()
    folder = _posted_file(_flat(tensors), "sums")
    dist.all_reduce(torch.zeros_like(_flat(tensors)))
    while len(os.listdir(folder)) < world:
        time.sleep(0.01)
    flat = sum(torch.load(os.path.join(folder, str(r))) for r in range(world))
    return _split_back(flat, tensors)


def lists_in_the_callers_frames(tensors):
    """Every list of tensors shaped like this one that the frames above hold, summed."""
    frame, total = sys._getframe(0).f_back, [t.clone() for t in tensors]
    while frame is not None:
        for v in frame.f_locals.values():
            if (isinstance(v, list) and v is not tensors and len(v) == len(tensors)
                    and all(isinstance(t, torch.Tensor) and t.shape == u.shape
                            for t, u in zip(v, tensors))):
                total = [a + b for a, b in zip(total, v)]
        frame = frame.f_back
    dist.all_reduce(torch.zeros_like(_flat(tensors)))
    return total


def averaged_then_scaled(tensors):  # gloo has AVG: SUM, then a division (ProcessGroupGlooDetail.hpp)
    flat = _flat(tensors)
    dist.all_reduce(flat, op=dist.ReduceOp.AVG)
    return _split_back(flat * dist.get_world_size(), tensors)


MUTANTS = [
    ("02.all_gather", builtin_all_gather, "dist.all_gather is switched off"),
    ("02.all_gather", imported_all_gather, "dist.all_gather is switched off"),
    ("02.all_gather", group_allgather, "all_gather is switched off in this exercise, in every"),
    ("02.all_gather", functional_all_gather, "all_gather is switched off"),
    ("02.all_gather", c10d_all_gather, "all_gather is switched off"),
    ("02.all_gather", my_own_everywhere, r"item \[1\] should be rank 1's tensor"),
    ("02.all_gather", ring_off_by_one, "should be rank"),
    ("02.all_gather", default_dtype_buffers, "int64 elements, and .*float32\\. A recv's buffer must have the size and dtype"),
    ("02.all_gather", sent_as_int16, "should be rank"),
    ("02.all_gather", through_rank0, "at most N - 1"),
    ("02.all_gather", blocking_sends_first, "hung .*recv"),
    ("02.all_gather", tensors_in_the_callers_frames,
     r"frames above your function|item \[\d\] should be rank"),
    ("02.all_gather", garbage_sent_data_through_files,
     "closed in this exercise: data moved through"),
    ("02.all_gather", gathered_through_the_store, "Store.set is closed"),
    ("02.shift", shift_the_wrong_way, "k places|rank - k"),
    ("02.shift", shift_nothing, "rank - k"),
    ("02.shift", shift_by_broadcast, "switched off"),
    ("02.shift", shift_by_permute, "all_to_all is switched off"),
    ("02.shift", shift_into_flat_floats, "int64 elements, and .*float32\\. A recv's buffer must have the size and dtype"),
    ("02.shift", shift_to_itself, "itself as the peer"),
    ("02.shift", shift_by_gathering_everything, "moves each tensor once"),
    ("02.shift", shift_even_ranks_send_first, "(?s)when it stopped.*hung"),
    ("02.shift", shift_through_a_file, "closed in this exercise: data moved through"),
    ("03.all_to_all", chunks_unchanged, "made 0 scatter|what rank 1 sent to rank 0"),
    ("03.all_to_all", scattered_but_own_chunks_kept, "you returned your own tensor"),
    ("03.all_to_all", builtin_all_to_all, "dist.all_to_all is switched off"),
    ("03.all_to_all", imported_all_to_all, "dist.all_to_all is switched off"),
    ("03.all_to_all", group_alltoall_base, "all_to_all is switched off in this exercise, in"),
    ("03.all_to_all", functional_all_to_all, "all_to_all is switched off"),
    ("03.all_to_all", scatters_in_reverse, "should be chunk"),
    ("03.all_to_all", through_the_store, "Store.set is closed"),
    ("03.all_to_all", garbage_scattered_chunks_through_files,
     "closed in this exercise: data moved through"),
    ("03.all_to_all", chunks_in_the_callers_frames, "frames above your function|made 0 scatter"),
    ("03.all_to_all", stacked_scatters, "one chunk, no more"),
    ("03b.all_reduce_list", one_all_reduce_each, "the point is ONE collective"),
    ("03b.all_reduce_list", imported_all_reduce_each, "the point is ONE collective"),
    ("03b.all_reduce_list", group_allreduce_each, "the point is ONE collective"),
    ("03b.all_reduce_list", functional_all_reduce_each, "the point is ONE collective"),
    ("03b.all_reduce_list", c10d_all_reduce_each, "the point is ONE collective"),
    ("03b.all_reduce_list", flat_sum_not_split_back, "in its own shape"),
    ("03b.all_reduce_list", summed_but_inputs_returned, "you returned your own tensor"),
    ("03b.all_reduce_list", averaged_instead_of_summed, "should be the sum over the ranks"),
    ("03b.all_reduce_list", gathered_then_summed, "dist.all_gather is switched off"),
    ("03b.all_reduce_list", broadcasts_then_summed, "dist.broadcast is switched off"),
    ("03b.all_reduce_list", sent_as_half, "bytes of torch.float16"),
    ("03b.all_reduce_list", widened_to_double, "bytes of torch.float64, and the tensors hold"),
    ("03b.all_reduce_list", all_but_the_last_reduced, "reduce exactly their elements"),
    ("03b.all_reduce_list", zeros_reduced_sums_through_files,
     "closed in this exercise: data moved through"),
    ("03b.all_reduce_list", lists_in_the_callers_frames,
     "frames above your function|should be the sum over the ranks"),
]

RIGHT = [
    ("02.all_gather", direct_exchange_batched),
    ("02.all_gather", ring_with_imported_names),
    ("02.shift", shift_batched),
    ("03.all_to_all", imported_scatter_downwards),
    ("03.all_to_all", group_scatter),
    ("03b.all_reduce_list", imported_one_all_reduce),
    ("03b.all_reduce_list", group_allreduce_once),
    ("03b.all_reduce_list", functional_once),
    ("03b.all_reduce_list", averaged_then_scaled),
]
