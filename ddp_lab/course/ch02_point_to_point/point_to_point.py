"""Notebook 02: point-to-point communication.

One rank sends a tensor, one named rank receives it: blocking ``send``/``recv``,
non-blocking ``isend``/``irecv`` that return a work object, a token passed around a ring,
the send-send deadlock with its three fixes, and a ping-pong that measures latency and
bandwidth against message size. Rank functions need no arguments (``ddp-lab run`` starts
them as they are); socket_accepts_unread and measure_ping_pong run in the calling
process.
"""

from __future__ import annotations

import socket
import statistics
import time
from dataclasses import dataclass

import torch
import torch.distributed as dist

from ddp_lab.course.units import format_bytes


def nonblocking_send_recv() -> float:
    """Rank 0 sends a tensor to every other rank without waiting between sends. ``isend``
    and ``irecv`` return at once with a work object; ``wait()`` is where the rank blocks."""
    rank, world = dist.get_rank(), dist.get_world_size()
    tensor = torch.zeros(1)
    if rank == 0:
        tensor += 1
        requests = [dist.isend(tensor=tensor, dst=peer) for peer in range(1, world)]
    else:
        requests = [dist.irecv(tensor=tensor, src=0)]
    if requests:
        print(f"started {len(requests)} request(s) of type {type(requests[0]).__name__}")
    else:
        print("no other rank: nothing to send")  # world size 1: rank 0 keeps its tensor
    for request in requests:
        request.wait()  # until here, neither side may touch `tensor`
    print(f"Rank {rank} has data {tensor[0]}")
    return tensor.item()


def recv_from_any() -> list[tuple[int, float]]:
    """Every other rank sends 10 * its rank to rank 0, which receives them in whatever
    order they come: ``recv`` without ``src`` returns the sender's rank (gloo and MPI
    only; NCCL has no receive-from-any-source)."""
    rank, world = dist.get_rank(), dist.get_world_size()
    if rank != 0:
        dist.send(torch.tensor([10.0 * rank]), dst=0)
        return []
    arrivals = []
    for _ in range(world - 1):
        message = torch.zeros(1)
        sender = dist.recv(message)
        arrivals.append((sender, message.item()))
    print(f"arrived (sender, value): {arrivals}")
    return arrivals


def ring_token(numel: int = 1, dtype: torch.dtype = torch.int64) -> torch.Tensor:
    """Rank 0 starts a token, every rank adds its rank and passes it to the right, and the
    token comes home to rank 0 holding 0 + 1 + ... + (N-1) = N(N-1)/2 on top of its start."""
    rank, world = dist.get_rank(), dist.get_world_size()
    right, left = (rank + 1) % world, (rank - 1) % world
    token = torch.arange(numel).to(dtype)
    if rank != 0:
        dist.recv(token, src=left)
    token += rank
    print(f"adds {rank}, passes {token.tolist()} to rank {right}")
    dist.send(token, dst=right)
    if rank == 0:
        dist.recv(token, src=left)
        print(f"the token came home: {token.tolist()}")
    return token


def _ring_buffers(nbytes: int):
    """Rank, neighbours, and the two buffers of a ring exchange: what this rank sends (its
    rank in every byte, so the receiver can tell who sent it) and where the left one lands."""
    rank, world = dist.get_rank(), dist.get_world_size()
    _refuse_no_ring(nbytes, world)
    outgoing = torch.full((nbytes,), rank, dtype=torch.uint8)
    incoming = torch.empty(nbytes, dtype=torch.uint8)
    return (rank + 1) % world, (rank - 1) % world, outgoing, incoming


def _refuse_no_ring(nbytes: int, world: int) -> None:
    """Before any send: a message of no bytes carries no sender rank to read, and one rank
    alone is its own neighbour (gloo's transport has no connection to itself: its isend
    fails with "Pair is not connected", which names neither cause)."""
    if nbytes < 1:
        raise ValueError(f"nbytes={nbytes}: a ring exchange needs messages of 1 byte or more "
                         "(each byte carries the sender's rank); pass nbytes >= 1.")
    if world < 2:
        raise ValueError("a ring exchange needs 2 or more ranks: on 1 rank the neighbours are "
                         "the rank itself; run it with world_size >= 2.")


def _sender_of(incoming: torch.Tensor) -> int:
    """The rank written in every byte of the message, or -1 if it arrived damaged."""
    first = int(incoming[0])
    return first if bool((incoming == first).all()) else -1


def send_then_recv(nbytes: int = 4 << 20) -> int:
    """The classic deadlock: every rank first sends to its right, then receives from its
    left. A blocking send waits for the receiver's recv, and nobody gets that far."""
    right, left, outgoing, incoming = _ring_buffers(nbytes)
    dist.send(outgoing, dst=right)
    dist.recv(incoming, src=left)
    return _sender_of(incoming)


def even_odd_exchange(nbytes: int = 4 << 20) -> int:
    """Fix 1: even ranks send first, odd ranks receive first, so every send meets a posted
    recv. With an odd world size ranks N-1 and 0 are both even: a chain, still no cycle."""
    right, left, outgoing, incoming = _ring_buffers(nbytes)
    if dist.get_rank() % 2 == 0:
        dist.send(outgoing, dst=right)
        dist.recv(incoming, src=left)
    else:
        dist.recv(incoming, src=left)
        dist.send(outgoing, dst=right)
    return _sender_of(incoming)


def nonblocking_exchange(nbytes: int = 4 << 20) -> int:
    """Fix 2: post the send and the recv before waiting on either."""
    right, left, outgoing, incoming = _ring_buffers(nbytes)
    requests = [dist.isend(outgoing, dst=right), dist.irecv(incoming, src=left)]
    for request in requests:
        request.wait()
    return _sender_of(incoming)


def batched_exchange(nbytes: int = 4 << 20) -> int:
    """Fix 3: describe both operations as ``P2POp`` and start them together. On NCCL this
    is the required form: it wraps them in ncclGroupStart/ncclGroupEnd."""
    right, left, outgoing, incoming = _ring_buffers(nbytes)
    ops = [dist.P2POp(dist.isend, outgoing, right), dist.P2POp(dist.irecv, incoming, left)]
    for request in dist.batch_isend_irecv(ops):
        request.wait()
    return _sender_of(incoming)


def socket_accepts_unread() -> int:
    """Bytes a loopback TCP socket takes with nobody reading the other end: what an eager
    (buffered) send can hand to the kernel and return from without any matching recv.
    The listener accepts our own connection only: on a shared machine another user may
    connect to it first."""
    with socket.create_server(("127.0.0.1", 0)) as server, \
            socket.create_connection(server.getsockname()) as sender:
        receiver = _accept_from(server, sender.getsockname())
        with receiver:
            sender.setblocking(False)
            accepted = 0
            try:
                while True:
                    accepted += sender.send(bytes(64 * 1024))
            except BlockingIOError:
                return accepted


def _accept_from(server: socket.socket, peer) -> socket.socket:
    while True:
        connection, address = server.accept()
        if address == peer:
            return connection
        connection.close()


@dataclass(frozen=True)
class PingPongConfig:
    """Message sizes (bytes, 1 B to 64 MiB by default) and timed round trips per size,
    after ``warmup`` untimed ones that set up buffers and connections."""

    sizes: tuple[int, ...] = tuple(4 ** k for k in range(14))
    repeats: int = 10
    warmup: int = 1


def ping_pong(config: PingPongConfig = PingPongConfig()) -> dict | None:
    """Rank 0 sends a uint8 tensor to rank 1, which sends it straight back; rank 0 times
    each round trip. Other ranks sit it out. Returns {size: [seconds, ...]} on rank 0."""
    rank = dist.get_rank()
    round_trips = {}
    for size in config.sizes:
        message = torch.zeros(size, dtype=torch.uint8)
        times = [_bounce(rank, message) for _ in range(config.warmup + config.repeats)]
        round_trips[size] = times[config.warmup:]
    return round_trips if rank == 0 else None


def _bounce(rank: int, message: torch.Tensor) -> float:
    start = time.perf_counter()
    if rank == 0:
        dist.send(message, dst=1)
        dist.recv(message, src=1)
    elif rank == 1:
        dist.recv(message, src=0)
        dist.send(message, dst=0)
    return time.perf_counter() - start


@dataclass(frozen=True)
class PingPong:
    """Measured round trips, ``round_trips[size]`` in seconds. Noise on shared cores only
    ever adds time, so the fastest round trip is the estimate of what the link costs."""

    round_trips: dict[int, list[float]]

    @property
    def sizes(self) -> list[int]:
        return sorted(self.round_trips)

    @property
    def latency(self) -> list[float]:
        """One-way time per size (seconds): half the fastest round trip."""
        return [min(self.round_trips[s]) / 2 for s in self.sizes]

    @property
    def bandwidth(self) -> list[float]:
        """Bytes per second one way: size / one-way time."""
        return [s / t for s, t in zip(self.sizes, self.latency)]

    @property
    def alpha(self) -> float:
        """The fixed cost of any message, estimated as the fastest one-way time seen (the
        small messages': no message costs less)."""
        return min(self.latency)

    @property
    def peak_bandwidth(self) -> float:
        """The best bandwidth seen, about 1/beta: the cost per byte of large messages."""
        return max(self.bandwidth)

    @property
    def half_bandwidth_size(self) -> float:
        """alpha/beta: the size whose transfer time equals the fixed cost. Smaller messages
        are latency-bound, larger ones bandwidth-bound; it reaches about half the peak."""
        return self.alpha * self.peak_bandwidth

    def table(self) -> str:
        rows = [f"{'size':>9} {'one-way (best)':>15} {'(median)':>10} {'bandwidth':>14}"]
        for size, latency, bw in zip(self.sizes, self.latency, self.bandwidth):
            median = statistics.median(self.round_trips[size]) / 2
            rows.append(f"{format_bytes(size):>9} {latency * 1e6:>12.1f} us "
                        f"{median * 1e6:>7.0f} us {bw / 1e6:>9.2f} MB/s")
        return "\n".join(rows)


def measure_ping_pong(config: PingPongConfig = PingPongConfig(), world_size: int = 2,
                      timeout: float = 60.0) -> PingPong:
    import ddp_lab
    res = ddp_lab.run(ping_pong, world_size=world_size, args=(config,), timeout=timeout,
                      echo=False)
    return PingPong(res.values[0])
