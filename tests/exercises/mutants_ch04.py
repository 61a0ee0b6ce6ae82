"""Wrong answers to the exercises of notebook 04: the ones a learner really writes.

MUTANTS holds (exercise, wrong answer, a regex the rejection must match); test_mutations.py
checks every one with a single parametrized test. Data and functions only, no test here."""

from __future__ import annotations

import inspect
import os
import pickle
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as fc
from torch.distributed import (all_reduce, broadcast, irecv, isend, recv, reduce_scatter_single,
                               reduce_scatter_tensor, send)
from torch.distributed.distributed_c10d import _get_default_group

from ddp_lab.course.ch04_allreduce import allreduce as ar


# -- 04 --------------------------------------------------------------------------------------
def whole_tensor_to_everyone(tensor):
    rank, world = dist.get_rank(), dist.get_world_size()
    total = tensor.clone()
    for peer in range(world):
        if peer != rank:
            incoming = torch.empty_like(tensor)
            for request in (dist.isend(tensor, peer), dist.irecv(incoming, peer)):
                request.wait()
            total += incoming
    return total.chunk(world)[rank]


def builtin_reduce(tensor):
    total = tensor.clone()
    dist.all_reduce(total)
    return total.chunk(dist.get_world_size())[dist.get_rank()]


def ring_wrong_chunk(tensor):
    rank, world = dist.get_rank(), dist.get_world_size()
    chunks = [piece.clone() for piece in tensor.chunk(world)]
    for step in range(world - 1):  # unshifted: rank r ends with chunk r + 1
        outgoing, into = chunks[(rank - step) % world], chunks[(rank - step - 1) % world]
        incoming = torch.empty_like(into)
        for request in (dist.isend(outgoing, (rank + 1) % world),
                        dist.irecv(incoming, (rank - 1) % world)):
            request.wait()
        into += incoming
    return chunks[rank]


def root_sends_to_all(tensor, src):
    rank, data = dist.get_rank(), tensor.clone()
    if rank == src:
        for peer in range(dist.get_world_size()):
            if peer != src:
                dist.send(data, peer)
    else:
        dist.recv(data, src)
    return data


def chain(tensor, src):
    rank, world = dist.get_rank(), dist.get_world_size()
    data = tensor.clone()
    if (rank - src) % world:
        dist.recv(data, (rank - 1) % world)
    if (rank - src) % world < world - 1:
        dist.send(data, (rank + 1) % world)
    return data


def builtin_broadcast(tensor, src):
    data = tensor.clone()
    dist.broadcast(data, src)
    return data


def _binomial_tree(data, src):
    """The reference's binomial tree, written out (the reference itself refuses in a check)."""
    rank, world = dist.get_rank(), dist.get_world_size()
    relative, mask = (rank - src) % world, 1
    while mask < world:
        if relative < mask and relative + mask < world:
            send(data, (relative + mask + src) % world)
        elif mask <= relative < 2 * mask:
            recv(data, (relative - mask + src) % world)
        mask *= 2
    return data


def tree_rooted_at_zero(tensor, src):
    return _binomial_tree(tensor.clone(), 0)


# -- 04: the switched-off built-ins in every form -------------------------------------------
def imported_reduce_scatter(tensor):
    out = torch.empty_like(tensor.chunk(dist.get_world_size())[0])
    reduce_scatter_single(out, tensor)
    return out


def imported_reduce_scatter_old_name(tensor):
    """torch 2.13's deprecated spelling: forwards to reduce_scatter_single (FutureWarning)."""
    out = torch.empty_like(tensor.chunk(dist.get_world_size())[0])
    reduce_scatter_tensor(out, tensor)
    return out


def own_chunk_unsummed(tensor):
    """The ring's bytes sent, but the partial sums received are dropped."""
    rank, world = dist.get_rank(), dist.get_world_size()
    chunks = [piece.clone() for piece in tensor.chunk(world)]
    for step in range(world - 1):
        incoming = torch.empty_like(chunks[(rank - step - 2) % world])
        for request in (isend(chunks[(rank - step - 1) % world], (rank + 1) % world),
                        irecv(incoming, (rank - 1) % world)):
            request.wait()
    return chunks[rank]


def input_unchanged(tensor, src):
    return tensor.clone()


def imported_all_reduce(tensor):
    total = tensor.clone()
    all_reduce(total)
    return total.chunk(dist.get_world_size())[dist.get_rank()]


def process_group_allreduce(tensor):
    total = tensor.clone()
    _get_default_group().allreduce([total]).wait()
    return total.chunk(dist.get_world_size())[dist.get_rank()]


def functional_all_reduce(tensor):
    total = fc.wait_tensor(fc.all_reduce(tensor, "sum", dist.group.WORLD))
    return total.chunk(dist.get_world_size())[dist.get_rank()]


def c10d_module_all_reduce(tensor):
    total = tensor.clone()
    dist.distributed_c10d.all_reduce(total)
    return total.chunk(dist.get_world_size())[dist.get_rank()]


# -- 04: cost cheats ---------------------------------------------------------------------------
def _whole_tensor_exchange(tensor, outgoing, post):
    """Every rank swaps a whole tensor with every other, in a deadlock-free order."""
    rank, world = dist.get_rank(), dist.get_world_size()
    total = tensor.clone()
    for peer in range(world):
        if peer != rank:
            incoming = torch.empty_like(outgoing)
            post(outgoing, incoming, peer)
            total += incoming.to(tensor.dtype)
    return total.chunk(world)[rank]


def blocking_whole_tensor(tensor):
    """The whole tensor with blocking send/recv (the old counter saw only isend: 0 bytes)."""
    def post(outgoing, incoming, peer):
        if dist.get_rank() < peer:
            send(outgoing, peer)
            recv(incoming, peer)
        else:
            recv(incoming, peer)
            send(outgoing, peer)
    return _whole_tensor_exchange(tensor, tensor, post)


def process_group_send_whole(tensor):
    def post(outgoing, incoming, peer):
        group = _get_default_group()
        for work in (group.send([outgoing], peer, 0), group.recv([incoming], peer, 0)):
            work.wait()
    return _whole_tensor_exchange(tensor, tensor, post)


def downcast_whole_tensor(tensor):
    """The whole tensor to everyone, as int16 to look a quarter the size."""
    def post(outgoing, incoming, peer):
        for request in (isend(outgoing, peer), irecv(incoming, peer)):
            request.wait()
    return _whole_tensor_exchange(tensor, tensor.to(torch.int16), post)


def downcast_ring(tensor):
    """The ring, on int16 chunks: a quarter of the bytes, and most of the values lost."""
    return ring_with_blocking_calls(tensor.to(torch.int16)).to(tensor.dtype)


def process_group_broadcast(tensor, src):
    data, options = tensor.clone(), dist.BroadcastOptions()
    options.rootRank = src
    _get_default_group().broadcast([data], options).wait()
    return data


def imported_broadcast(tensor, src):
    data = tensor.clone()
    broadcast(data, src)
    return data


def functional_broadcast(tensor, src):
    return fc.wait_tensor(fc.broadcast(tensor, src, dist.group.WORLD))


def root_isends_to_all(tensor, src):
    rank, data = dist.get_rank(), tensor.clone()
    if rank == src:
        for request in [isend(data, p) for p in range(dist.get_world_size()) if p != src]:
            request.wait()
    else:
        irecv(data, src).wait()
    return data


# -- 04: mismatched buffers (gloo aborts or misreads without a word) ------------------------------
def _ring_receiving_into(tensor, buffer_like):
    rank, world = dist.get_rank(), dist.get_world_size()
    chunks = [piece.clone() for piece in tensor.chunk(world)]
    for step in range(world - 1):
        outgoing, into = chunks[(rank - step - 1) % world], chunks[(rank - step - 2) % world]
        incoming = buffer_like(into)
        for request in (isend(outgoing, (rank + 1) % world), irecv(incoming, (rank - 1) % world)):
            request.wait()
        into[:incoming.numel()] += incoming.to(into.dtype)
    return chunks[rank]


def recv_buffer_too_small(tensor):
    return _ring_receiving_into(tensor, lambda into: torch.zeros(into.numel() - 1,
                                                                 dtype=into.dtype))


def recv_buffer_float64(tensor):
    return _ring_receiving_into(tensor, lambda into: torch.zeros(into.shape,
                                                                 dtype=torch.float64))


def tree_into_float64(tensor, src):
    data = _binomial_tree(tensor.double() if dist.get_rank() != src else tensor.clone(), src)
    return data.to(tensor.dtype)


def through_the_store(tensor):
    """Every rank's tensor through the key-value store: no send, no counted byte."""
    rank, world = dist.get_rank(), dist.get_world_size()
    store = dist.distributed_c10d._get_default_store()
    store.set(f"rs{rank}", tensor.numpy().tobytes())
    total = torch.zeros_like(tensor)
    for peer in range(world):
        raw = bytearray(store.get(f"rs{peer}"))
        total += torch.frombuffer(raw, dtype=tensor.dtype)
    return total.chunk(world)[rank]


# -- 04: cheats a grade must stop --------------------------------------------------------------
# Those that walk f_back from inspect.currentframe() are rejected by the value they return, or
# by the seal where it refuses currentframe() itself: either phrase is accepted.
def reads_callers_frames(tensor):
    """Looks for the inputs or the check's seed in the checker's frame, to rebuild the sums."""
    caller = sys._getframe(1).f_locals
    rank, world = dist.get_rank(), dist.get_world_size()
    if "inputs" in caller:
        return sum(caller["inputs"][world]).chunk(world)[rank]
    return tensor.chunk(world)[rank]


def walks_f_back(tensor):
    """Plain f_back from its own frame (no sys._getframe(1)): finds its own input only."""
    frame, rank, world = inspect.currentframe(), dist.get_rank(), dist.get_world_size()
    while frame is not None:
        dealt = frame.f_locals.get("dealt")
        if dealt is not None and getattr(dealt, "items", None):
            inputs = [pickle.loads(bytes(item)) for item in dealt.items]
            return sum(inputs).chunk(world)[rank]
        frame = frame.f_back
    return tensor.chunk(world)[rank]


def ring_of_garbage(tensor):
    """The ring's bytes exactly, of zeros: the cost is right and the sums are not."""
    rank, world = dist.get_rank(), dist.get_world_size()
    chunk = tensor.chunk(world)[rank].clone()
    for _ in range(world - 1):
        incoming = torch.empty_like(chunk)
        for request in (isend(torch.zeros_like(chunk), (rank + 1) % world),
                        irecv(incoming, (rank - 1) % world)):
            request.wait()
    return chunk + incoming if world > 1 else chunk


def half_chunks_ring(tensor):
    """The ring on half of every chunk: half the bytes, half the sums missing."""
    rank, world = dist.get_rank(), dist.get_world_size()
    chunks = [piece.clone() for piece in tensor.chunk(world)]
    for step in range(world - 1):
        outgoing, into = chunks[(rank - step - 1) % world], chunks[(rank - step - 2) % world]
        half = into.numel() // 2  # a chunk of one element: nothing sent at all
        if not half:
            continue
        incoming = torch.empty_like(into[:half])
        for request in (isend(outgoing[:half].contiguous(), (rank + 1) % world),
                        irecv(incoming, (rank - 1) % world)):
            request.wait()
        into[:half] += incoming
    return chunks[rank]


def _shared_folder():
    folder = Path(tempfile.gettempdir()) / f"rs-cheat-{os.getppid()}"
    folder.mkdir(exist_ok=True)
    return folder


def through_a_file(tensor):
    """Every rank's tensor through a shared folder: no send, no counted byte."""
    rank, world = dist.get_rank(), dist.get_world_size()
    folder = _shared_folder()
    torch.save(tensor, folder / f"{rank}.pt")
    while len(list(folder.glob("*.pt"))) < world:
        time.sleep(0.01)
    time.sleep(0.1)
    total = sum(torch.load(folder / f"{peer}.pt") for peer in range(world))
    dist.barrier()
    if rank == 0:
        shutil.rmtree(folder)
    return total.chunk(world)[rank]


def sends_from_its_own_thread(tensor):
    """The whole tensor to everyone from a thread of its own, where nothing is counted."""
    box = []
    worker = threading.Thread(target=lambda: box.append(whole_tensor_to_everyone(tensor)))
    worker.start()
    worker.join()
    return box[0]


def broadcast_reads_callers_frames(tensor, src):
    """Walks up from its own frame (plain f_back) for the inputs, or src's tensor."""
    frame = inspect.currentframe().f_back
    while frame is not None:
        for value in frame.f_locals.values():
            if isinstance(value, torch.Tensor) and value.shape == tensor.shape and bool(
                    value.any()):
                return value.clone()
        frame = frame.f_back
    return tensor.clone()


def broadcast_of_garbage(tensor, src):
    """A binomial tree of the right shape and bytes that carries zeros from the root."""
    return _binomial_tree(torch.zeros_like(tensor), src)


def tree_with_wraparound(tensor, src):
    """Every holder sends each round, to (relative + mask) mod N: ceil(log2 N) rounds, but
    on 3 ranks a copy goes back to a rank that holds the data already."""
    rank, world = dist.get_rank(), dist.get_world_size()
    relative, data, mask = (rank - src) % world, tensor.clone(), 1
    while mask < world:
        requests, incoming = [], torch.empty_like(data)
        if relative < mask:
            requests.append(isend(data, ((relative + mask) % world + src) % world))
        if mask <= relative < 2 * mask:
            requests.append(irecv(incoming, (relative - mask + src) % world))
        elif relative < mask and relative + world - mask < mask:
            requests.append(irecv(torch.empty_like(data), (relative - mask + src) % world))
        for request in requests:
            request.wait()
        if mask <= relative < 2 * mask:
            data = incoming
        mask *= 2
    return data


def broadcast_through_a_file(tensor, src):
    folder = _shared_folder()
    if dist.get_rank() == src:
        torch.save(tensor, folder / "data.part")
        os.replace(folder / "data.part", folder / "data.pt")
    while not (folder / "data.pt").exists():
        time.sleep(0.01)
    data = torch.load(folder / "data.pt")
    dist.barrier()
    if dist.get_rank() == src:
        shutil.rmtree(folder)
    return data


# -- 04: right but different -------------------------------------------------------------------
def ring_with_blocking_calls(tensor):
    """The ring's first phase with blocking send/recv, even ranks sending first."""
    rank, world = dist.get_rank(), dist.get_world_size()
    chunks = [piece.clone() for piece in tensor.chunk(world)]
    for step in range(world - 1):
        outgoing, into = chunks[(rank - step - 1) % world], chunks[(rank - step - 2) % world]
        incoming = torch.empty_like(into)
        if rank % 2 == 0:
            send(outgoing, (rank + 1) % world)
            recv(incoming, (rank - 1) % world)
        else:
            recv(incoming, (rank - 1) % world)
            send(outgoing, (rank + 1) % world)
        into += incoming
    return chunks[rank]


def ring_batched(tensor):
    rank, world = dist.get_rank(), dist.get_world_size()
    chunks = [piece.clone() for piece in tensor.chunk(world)]
    for step in range(world - 1):
        into = chunks[(rank - step - 2) % world]
        incoming = torch.empty_like(into)
        ops = [dist.P2POp(isend, chunks[(rank - step - 1) % world], (rank + 1) % world),
               dist.P2POp(irecv, incoming, (rank - 1) % world)]
        for request in dist.batch_isend_irecv(ops):
            request.wait()
        into += incoming
    return chunks[rank]


def tree_top_down(tensor, src):
    """The other binomial tree: the largest distance first (MPICH's broadcast)."""
    rank, world = dist.get_rank(), dist.get_world_size()
    relative, data = (rank - src) % world, tensor.clone()
    mask = 1
    while mask < world:
        mask *= 2
    mask //= 2
    while mask:
        if relative % (2 * mask) == 0 and relative + mask < world:
            send(data, (relative + mask + src) % world)
        elif relative % (2 * mask) == mask:
            recv(data, (relative - mask + src) % world)
        mask //= 2
    return data


def ring_on_a_link(tensor):
    """The notebook's own Link (ar.Link), whose exchange posts the send and recv together."""
    link = ar.Link()
    rank, world = link.rank, link.world
    chunks = [piece.clone() for piece in tensor.chunk(world)]
    for step in range(world - 1):
        into = chunks[(rank - step - 2) % world]
        incoming = torch.empty_like(into)
        link.exchange(chunks[(rank - step - 1) % world], (rank + 1) % world, incoming,
                      (rank - 1) % world)
        into += incoming
    return chunks[rank]


def pairwise_exchange(tensor):
    """Each rank sends chunk j straight to rank j: N - 1 chunks, the ring's bytes."""
    rank, world = dist.get_rank(), dist.get_world_size()
    chunks = tensor.chunk(world)
    total = chunks[rank].clone()
    incoming = [torch.empty_like(total) for _ in range(world)]
    requests = [request for peer in range(world) if peer != rank
                for request in (isend(chunks[peer].contiguous(), peer),
                                irecv(incoming[peer], peer))]
    for request in requests:
        request.wait()
    for peer in range(world):
        if peer != rank:
            total += incoming[peer]
    return total


def tree_on_a_link(tensor, src):
    link, data = ar.Link(), tensor.clone()
    relative, mask = (link.rank - src) % link.world, 1
    while mask < link.world:
        if relative < mask and relative + mask < link.world:
            link.send(data, (relative + mask + src) % link.world)
        elif mask <= relative < 2 * mask:
            link.recv(data, (relative - mask + src) % link.world)
        mask *= 2
    return data


RIGHT = [
    ("04.reduce_scatter", ring_on_a_link),
    ("04.reduce_scatter", pairwise_exchange),
    ("04.tree_broadcast", tree_on_a_link),
    ("04.reduce_scatter", ring_with_blocking_calls),
    ("04.reduce_scatter", ring_batched),
    ("04.tree_broadcast", tree_top_down),
]


MUTANTS = [
    ("04.reduce_scatter", imported_reduce_scatter, "dist.reduce_scatter is switched off"),
    ("04.reduce_scatter", imported_reduce_scatter_old_name, "dist.reduce_scatter is switched off"),
    ("04.reduce_scatter", own_chunk_unsummed, "you returned your own tensor, unchanged"),
    ("04.tree_broadcast", input_unchanged, "you returned your own tensor, unchanged"),
    ("04.reduce_scatter", imported_all_reduce, "dist.all_reduce is switched off"),
    ("04.reduce_scatter", process_group_allreduce, "dist.all_reduce is switched off"),
    ("04.reduce_scatter", functional_all_reduce, "dist.all_reduce is switched off"),
    ("04.reduce_scatter", c10d_module_all_reduce, "dist.all_reduce is switched off"),
    ("04.reduce_scatter", blocking_whole_tensor, "the ring sends"),
    ("04.reduce_scatter", process_group_send_whole, "the ring sends"),
    ("04.reduce_scatter", downcast_whole_tensor, "(?s)summed over all ranks.*narrower dtype"),
    ("04.reduce_scatter", downcast_ring, "summed over all ranks"),
    ("04.reduce_scatter", recv_buffer_too_small, "send and its recv do not match"),
    ("04.reduce_scatter", recv_buffer_float64, r"int64 elements, and rank \d's recv #1 .* float64"),
    ("04.reduce_scatter", through_the_store, "Store.set is closed in this exercise"),
    ("04.tree_broadcast", tree_into_float64, "send and its recv do not match"),
    ("04.tree_broadcast", process_group_broadcast, "dist.broadcast is switched off"),
    ("04.tree_broadcast", imported_broadcast, "dist.broadcast is switched off"),
    ("04.tree_broadcast", functional_broadcast, "dist.broadcast is switched off"),
    ("04.tree_broadcast", root_isends_to_all, r"took 3 rounds"),
    ("04.reduce_scatter", whole_tensor_to_everyone, "the ring sends"),
    ("04.reduce_scatter", builtin_reduce, "dist.all_reduce is switched off"),
    ("04.reduce_scatter", ring_wrong_chunk, "summed over all ranks"),
    ("04.tree_broadcast", root_sends_to_all, r"took 3 rounds .*ceil\(log2 4\) = 2"),
    ("04.tree_broadcast", chain, "took 3 rounds"),
    ("04.tree_broadcast", builtin_broadcast, "dist.broadcast is switched off"),
    ("04.tree_broadcast", tree_rooted_at_zero, "should return rank"),
    # cheats a grade must stop
    ("04.reduce_scatter", reads_callers_frames, "frames above your function are closed"),
    ("04.reduce_scatter", walks_f_back,
     "you returned your own tensor|frames above your function are closed"),
    ("04.reduce_scatter", ring_of_garbage, "you returned your own tensor"),
    ("04.reduce_scatter", half_chunks_ring, "summed over all ranks"),
    ("04.reduce_scatter", through_a_file, "is closed in this exercise: data moved through "
                                          "files"),
    ("04.reduce_scatter", sends_from_its_own_thread, "starting a thread is closed"),
    ("04.tree_broadcast", broadcast_reads_callers_frames,
     "you returned your own tensor|frames above your function are closed"),
    ("04.tree_broadcast", broadcast_of_garbage, r"should return rank \d's tensor"),
    ("04.tree_broadcast", tree_with_wraparound, "on 3 ranks .*each of the 2 other ranks to "
                                                "receive it once"),
    ("04.tree_broadcast", broadcast_through_a_file, "is closed in this exercise: data moved "
                                                    "through files"),
]
