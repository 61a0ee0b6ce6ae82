"""A small message's round trip over the channel against a raw TCP socket's, measured in the
same run against the same kind of second process, so that what differs is the channel's own
cost (framing, HMACs, the decoder); and that second process, the echo peer, which the tests
run too (``python -m ddp_lab.launch.remote.bench_channel --connect HOST:PORT``: the secret
comes on its stdin, as an agent's will). Without arguments it prints the figures:
``python -m ddp_lab.launch.remote.bench_channel``.

    from ddp_lab.launch.remote.bench_channel import round_trip
    round_trip(count=2000, size=64)    # -> RoundTrip(channel_us=..., raw_us=..., ...)
"""

from __future__ import annotations

import argparse
import contextlib
import socket
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass

from ddp_lab.launch.remote.channel import Channel, listener
from ddp_lab.launch.remote.channel_errors import ChannelClosed, ChannelError
from ddp_lab.launch.remote.handshake import AGENT, CONTROLLER
from ddp_lab.launch.remote.secret import SessionKey, read_secret, write_secret

REFUSED = 3  # the peer's exit status when it refused the other side (or was refused)
PEER_WAIT_S = 10.0
PEER_MODULE = "ddp_lab.launch.remote.bench_channel"  # this module, also when run as __main__


@dataclass(frozen=True)
class RoundTrip:
    """Median microseconds of one round trip of a ``size``-byte message, each way measured
    ``count`` times."""

    channel_us: float
    raw_us: float
    size: int
    count: int

    @property
    def ratio(self) -> float:
        return self.channel_us / self.raw_us


def round_trip(count: int = 500, size: int = 64, rounds: int = 10) -> RoundTrip:
    """Time ``count`` round trips on each, in alternating ``rounds``, so that a change in the
    machine's load falls on both."""
    key, payload = SessionKey.new(), bytes(size)
    timings: dict[str, list[float]] = {"channel": [], "raw": []}
    with listener("127.0.0.1") as server, listener("127.0.0.1") as raw_server, \
            echo_peer(server.getsockname(), key) as channel_peer, \
            echo_peer(raw_server.getsockname(), None, raw=size) as raw_peer:
        chan = Channel.accept(server, key, CONTROLLER, timeout=PEER_WAIT_S)
        raw = _accept_raw(raw_server)
        with chan, raw:
            for _ in range(rounds):
                timings["raw"] += _time(lambda: _raw_trip(raw, payload), count)
                timings["channel"] += _time(lambda: _channel_trip(chan, payload), count)
            chan.send("bye")
    for peer in (channel_peer, raw_peer):
        peer.wait(PEER_WAIT_S)
    return RoundTrip(statistics.median(timings["channel"]), statistics.median(timings["raw"]),
                     size, count * rounds)


def _time(trip, count: int) -> list[float]:
    times = []
    for _ in range(count):
        start = time.perf_counter()
        trip()
        times.append((time.perf_counter() - start) * 1e6)
    return times


def _channel_trip(chan: Channel, payload: bytes) -> None:
    chan.send("echo", payload)
    chan.recv()


def _raw_trip(sock: socket.socket, payload: bytes) -> None:
    sock.sendall(payload)
    _recv_exactly(sock, len(payload))


def _accept_raw(server: socket.socket) -> socket.socket:
    server.settimeout(PEER_WAIT_S)
    sock, _ = server.accept()
    sock.settimeout(None)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


def _recv_exactly(sock: socket.socket, size: int) -> bytes:
    data = b""
    while len(data) < size:
        chunk = sock.recv(size - len(data))
        if not chunk:
            raise ChannelClosed("the raw peer closed the connection")
        data += chunk
    return data


@contextlib.contextmanager
def echo_peer(address: tuple, key: SessionKey | bytes | None, role: str = AGENT,
              raw: int = 0, unpickle: bool = False):
    """The echo peer as a second process that connects to ``address``; its secret goes on
    its stdin. Killed and waited for on the way out, whatever happened."""
    command = [sys.executable, "-m", PEER_MODULE, "--connect", f"{address[0]}:{address[1]}",
               "--role", role] + (["--raw", str(raw)] if raw else []) \
        + (["--unpickle"] if unpickle else [])
    proc = subprocess.Popen(command, stdin=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        if key is not None:
            write_secret(proc.stdin.fileno(), key)
        proc.stdin.close()
        yield proc
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
        proc.stderr.close()


def main(argv: list[str] | None = None) -> int:
    """The echo peer: every message goes back as it came (unpickled first with
    ``--unpickle``) until the other side says "bye" or closes. Exit status REFUSED when
    the channel refused something, with the reason on stderr."""
    args = _parser().parse_args(argv)
    if args.connect is None:
        return _print_bench()
    host, port = args.connect.rsplit(":", 1)
    if args.raw:
        return _echo_raw((host, int(port)), args.raw)
    try:
        with Channel.connect((host, int(port)), read_secret(0, PEER_WAIT_S), args.role,
                             PEER_WAIT_S) as chan:
            _echo(chan, args.unpickle)
    except ChannelClosed:
        return 0
    except ChannelError as exc:
        print(f"refused: {type(exc).__name__}: {exc}", file=sys.stderr, flush=True)
        return REFUSED
    return 0


def _echo(chan: Channel, unpickle: bool) -> None:
    while (message := chan.recv()).kind != "bye":
        if unpickle:
            message.unpickle()
        chan.send(message.kind, message.body)


def _echo_raw(address: tuple, size: int) -> int:
    with socket.create_connection(address, timeout=PEER_WAIT_S) as sock:
        sock.settimeout(None)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        with contextlib.suppress(ChannelClosed):
            while True:
                sock.sendall(_recv_exactly(sock, size))
    return 0


def _print_bench() -> int:
    for size, count in ((64, 500), (4096, 500), (1 << 20, 10)):
        r = round_trip(count=count, size=size)
        print(f"{size:>8} bytes: channel {r.channel_us:8.1f} us, raw socket {r.raw_us:7.1f} "
              f"us, ratio {r.ratio:4.1f} (median of {r.count} round trips each)")
    return 0


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description="the channel's echo peer")
    parser.add_argument("--connect", help="HOST:PORT of the other side (without it: "
                        "run the benchmark and print its figures)")
    parser.add_argument("--role", default=AGENT, choices=(AGENT, CONTROLLER))
    parser.add_argument("--raw", type=int, default=0, help="echo raw messages of this size")
    parser.add_argument("--unpickle", action="store_true")
    return parser


if __name__ == "__main__":
    sys.exit(main())
