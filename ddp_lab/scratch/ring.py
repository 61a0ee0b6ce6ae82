"""The ring, on nothing but send/recv: the bandwidth-optimal all-reduce (a reduce-scatter
lap, then an all-gather lap, each rank sending 2(N-1)/N of the tensor, whatever N) and the
reduce-scatter on its own. Notebook 04 builds them step by step and checks them against
``dist.all_reduce``; ``Link`` is this rank's end of the wires, counting the bytes it sends.
"""

from __future__ import annotations

import torch
import torch.distributed as dist


class Link:
    """This rank's end of the wires: send/recv by group rank, counting bytes sent.

    Empty tensors are skipped on both sides (each side knows the sizes), because a chunk of
    a tensor smaller than the world size may be empty and gloo has nothing to move for it.
    """

    def __init__(self, group=None):
        self.group = group
        self.rank = dist.get_rank(group)
        self.world = dist.get_world_size(group)
        self.bytes_sent = 0

    def _peer(self, rank: int) -> int:
        return rank if self.group is None else dist.get_global_rank(self.group, rank)

    def send(self, tensor: torch.Tensor, dst: int) -> None:
        if tensor.numel():
            dist.send(tensor, self._peer(dst), group=self.group)
            self.bytes_sent += tensor.numel() * tensor.element_size()

    def recv(self, tensor: torch.Tensor, src: int) -> None:
        if tensor.numel():
            dist.recv(tensor, self._peer(src), group=self.group)

    def exchange(self, outgoing: torch.Tensor, dst: int, incoming: torch.Tensor, src: int):
        """Send and receive at once with ``dist.batch_isend_irecv``, then wait: no
        send-send deadlock, and the two directions of the link overlap instead of taking
        turns. On NCCL the batch is one ``ncclGroupStart/End`` group, so the send and the
        recv are posted together; a separate ``isend`` then ``irecv`` on both of 2 ranks
        can leave each rank's send waiting for a recv that is queued behind it, a deadlock
        (NCCL's maintainers: https://github.com/NVIDIA/nccl/issues/479). Gloo has no
        coalescing: there the batch is the same isend and irecv, posted before either is
        waited on."""
        ops = []
        if outgoing.numel():
            ops.append(dist.P2POp(dist.isend, outgoing, group=self.group, group_peer=dst))
            self.bytes_sent += outgoing.numel() * outgoing.element_size()
        if incoming.numel():
            ops.append(dist.P2POp(dist.irecv, incoming, group=self.group, group_peer=src))
        for request in dist.batch_isend_irecv(ops) if ops else []:
            request.wait()


def _flat(tensor: torch.Tensor) -> torch.Tensor:
    """A 1-D contiguous view of the tensor when possible (so results land in place), else a
    copy that ``_write_back`` returns into the tensor."""
    return tensor.view(-1) if tensor.is_contiguous() else tensor.contiguous().view(-1)


def _write_back(tensor: torch.Tensor, flat: torch.Tensor) -> torch.Tensor:
    if tensor.numel() and flat.data_ptr() != tensor.data_ptr():
        tensor.copy_(flat.view(tensor.shape))
    return tensor


def ring_all_reduce(tensor: torch.Tensor, group=None, link: Link | None = None,
                    on_step=None):
    """The bandwidth-optimal ring: cut the tensor into N chunks, reduce-scatter them around
    the ring (N-1 steps, each rank ends up owning one summed chunk), then all-gather the
    summed chunks (N-1 more steps). Each rank sends 2(N-1)/N of the tensor, whatever N.
    ``on_step(phase, step, flat)`` is called after every step (the notebook's pictures)."""
    link = link or Link(group)
    flat = _flat(tensor)
    chunks = torch.tensor_split(flat, link.world)  # contiguous views, sizes differ by <= 1
    scratch = torch.empty(chunks[0].numel(), dtype=flat.dtype, device=flat.device)
    _ring_phase(link, chunks, scratch, "reduce-scatter", on_step, flat)
    _ring_phase(link, chunks, scratch, "all-gather", on_step, flat)
    return _write_back(tensor, flat)


def _ring_phase(link: Link, chunks, scratch, phase: str, on_step, flat) -> None:
    """One lap of N-1 steps. In step s rank r sends chunk r-s (reduce-scatter) or r+1-s
    (all-gather) to the right and receives the chunk one lower from the left."""
    r, n = link.rank, link.world
    first = 0 if phase == "reduce-scatter" else 1
    for step in range(n - 1):
        out, into = chunks[(r + first - step) % n], chunks[(r + first - step - 1) % n]
        if phase == "reduce-scatter":
            incoming = scratch[:into.numel()]
            link.exchange(out, (r + 1) % n, incoming, (r - 1) % n)
            into += incoming
        else:
            link.exchange(out, (r + 1) % n, into, (r - 1) % n)  # lands in place
        if on_step is not None:
            on_step(phase, step, flat)


def ring_reduce_scatter(tensor: torch.Tensor) -> torch.Tensor:
    """Rank r's chunk of ``tensor`` (N equal chunks) summed over the ranks: the ring's first
    phase, shifted by one chunk so that rank r ends with chunk r (in ``ring_all_reduce`` it
    ends with chunk r + 1, where the all-gather starts). At each of N - 1 steps a rank sends
    one chunk right and adds the one from the left into its own partial sum; it sends
    (N - 1) / N of the tensor. Notebook 04's exercise 04.reduce_scatter, whose reference
    this is (its solved cell pastes this source, so it uses nothing but torch and dist).
    The chunks are cut along dim 0, so its size must divide by N, as
    ``dist.reduce_scatter_single`` also requires; anything else raises ``ValueError`` on
    every rank before any send (an uneven cut would differ from ``ring_all_reduce``'s)."""
    rank, world = dist.get_rank(), dist.get_world_size()
    if tensor.dim() == 0 or tensor.shape[0] % world:
        raise ValueError(
            f"ring_reduce_scatter cuts dim 0 into {world} equal chunks, one per rank, but "
            f"got shape {tuple(tensor.shape)}, whose dim 0 does not divide by {world} "
            "(dist.reduce_scatter_single refuses it too). Pad dim 0 to a multiple of the "
            "world size, or use ring_all_reduce, which takes any size.")
    right, left = (rank + 1) % world, (rank - 1) % world
    chunks = [c.clone() for c in tensor.chunk(world)]
    for step in range(world - 1):
        outgoing = chunks[(rank - step - 1) % world]
        into = chunks[(rank - step - 2) % world]
        incoming = torch.empty_like(into)
        for request in (dist.isend(outgoing, right), dist.irecv(incoming, left)):
            request.wait()
        into += incoming
    return chunks[rank]
