"""What a link between two ranks really delivers, measured with plain TCP between ranks 0
and 1 (no collective in the way): bandwidth of a bulk transfer, latency of a ping-pong.

Used by ``ddp-lab bench network`` and the tests to compare a shaped network
(``ddp_lab.Network``) with what it was configured to be; they run on any run, shaped or not.
"""

from __future__ import annotations

import os
import socket
import time

CHUNK = 1 << 20
SKIP_FRACTION = 0.1  # the first 10% fill the token bucket's burst and TCP's slow start


def tcp_bandwidth(nbytes: int) -> float:
    """Bits per second from rank 1 to rank 0 over a TCP stream of ``nbytes``, timed on the
    receiver from the moment a tenth has arrived: the steady rate, not the burst. The other
    ranks only take part in the exchange of the address."""
    import torch.distributed as dist
    listener, address = _listen_if_rank0()
    try:
        if dist.get_rank() == 1:
            _send_all(address, nbytes)
        elif dist.get_rank() == 0:
            return _receive_rate(listener, nbytes)
    finally:
        if listener is not None:
            listener.close()
        dist.barrier()
    return 0.0


def tcp_latency(round_trips: int = 200) -> float:
    """One-way latency in seconds from rank 0 to rank 1 (half the median round trip of a
    1-byte ping-pong with Nagle off)."""
    import torch.distributed as dist
    listener, address = _listen_if_rank0()
    times = []
    try:
        if dist.get_rank() < 2:
            times = _ping_pong(listener, address, round_trips)
    finally:
        if listener is not None:
            listener.close()
        dist.barrier()
    return sorted(times)[len(times) // 2] / 2 if times else 0.0


def rank_address() -> str:
    """The IPv4 address of the interface this rank's gloo uses (a shaped run: its link)."""
    import psutil
    name = os.environ.get("GLOO_SOCKET_IFNAME", "lo")
    return next(a.address for a in psutil.net_if_addrs()[name] if a.family == socket.AF_INET)


def _listen_if_rank0():
    import torch.distributed as dist
    listener = None
    box = [None]
    if dist.get_rank() == 0:
        listener = socket.create_server((rank_address(), 0))
        box = [listener.getsockname()]
    dist.broadcast_object_list(box, src=0)
    return listener, box[0]


def _send_all(address, nbytes: int) -> None:
    block = b"\0" * CHUNK
    with socket.create_connection(address) as conn:
        left = nbytes
        while left > 0:
            left -= conn.send(block[:min(CHUNK, left)])
        conn.shutdown(socket.SHUT_WR)
        conn.recv(1)  # the receiver has everything when it closes


def _receive_rate(listener: socket.socket, nbytes: int) -> float:
    conn, _ = listener.accept()
    with conn:
        got, start_at = 0, int(nbytes * SKIP_FRACTION)
        started = None
        while got < nbytes:
            piece = conn.recv(CHUNK)
            if not piece:
                raise ConnectionError(f"the sender stopped after {got} of {nbytes} bytes")
            got += len(piece)
            if started is None and got >= start_at:
                started, counted_from = time.perf_counter(), got
        seconds = time.perf_counter() - started
    return (got - counted_from) * 8 / max(seconds, 1e-9)


def _ping_pong(listener, address, round_trips: int) -> list[float]:
    import torch.distributed as dist
    if dist.get_rank() == 0:
        conn, _ = listener.accept()
    else:
        conn = socket.create_connection(address)
    conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    times = []
    with conn:
        for _ in range(round_trips + 5):  # 5 to warm up
            start = time.perf_counter()
            if dist.get_rank() == 0:
                conn.sendall(b"x")
                conn.recv(1)
            else:
                conn.recv(1)
                conn.sendall(b"x")
            times.append(time.perf_counter() - start)
    return times[5:]
