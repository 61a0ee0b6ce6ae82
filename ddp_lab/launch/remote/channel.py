"""One authenticated connection between the controller and a host's agent.

    key = SessionKey.new()                                  # the controller, per session
    chan = Channel.connect(("node1", port), key, CONTROLLER)    # or Channel.accept(listener, ...)
    chan.send("call", pickle.dumps(call), timeout=2.0)
    reply = chan.recv(timeout=30.0).unpickle()              # authenticated before unpickled

An agent loops on ``recv()``. The controller, which reads several hosts at once, registers
``chan`` (it has a ``fileno``) in its selector and calls ``receive_ready()`` when it is
readable, as output/reader.py does for pipes. A send never blocks past its deadline: a
peer that stopped reading cannot wedge the notebook. Any failure closes the channel and
raises a ChannelError (channel_errors.py).

Cheap per message, since a cross-host call should cost little more than a local one: one
``sendmsg`` of header, body and HMAC (the body is not copied into a frame), one HMAC over
the bytes as they lie in the receive buffer, TCP_NODELAY (a small message leaves at once
instead of waiting for Nagle's timer).
"""

from __future__ import annotations

import select
import socket
import threading
import time
from collections import deque

from ddp_lab.launch.remote.channel_errors import (ChannelClosed, ChannelError,
                                                  ChannelTimeout, PeerRefused)
from ddp_lab.launch.remote.codec import MAX_BODY, FrameDecoder, Message, Signer, encode_kind
from ddp_lab.launch.remote.handshake import HANDSHAKE_S, check_role, handshake
from ddp_lab.launch.remote.secret import SessionKey, as_key

CHUNK = 1 << 18
READY_BUDGET = 1 << 22  # receive_ready reads at most this much per call: other hosts' turn
SEND_S = 10.0
WILDCARDS = ("", "0.0.0.0", "::")


def listener(host: str, port: int = 0) -> socket.socket:
    """A listening TCP socket on ``host`` (one interface, never all of them)."""
    if host in WILDCARDS:
        raise ValueError(f"listen on one address (the interface the peers reach), not "
                         f"{host!r}, which is every interface of the machine")
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.bind((host, port))
        sock.listen()
    except OSError:
        sock.close()
        raise
    return sock


class Channel:
    """A connected, authenticated socket; made by ``over``, ``connect`` or ``accept``. Any
    thread may send (sends are serialized); one thread at a time receives."""

    def __init__(self, sock: socket.socket, role: str, keys, max_body: int = MAX_BODY):
        self._sock, self.role = sock, role
        sock.setblocking(False)  # every wait is a poll with its deadline
        self._signer = Signer(keys.send)
        self._decoder = FrameDecoder(keys.receive, max_body)
        self._ready: deque[Message] = deque()
        self._chunk = bytearray(CHUNK)
        self._chunk_view = memoryview(self._chunk)
        self._send_lock = threading.Lock()
        self._poll_in = select.poll()
        self._poll_in.register(sock, select.POLLIN)
        self._closed = False

    @classmethod
    def over(cls, sock: socket.socket, key: SessionKey | bytes, role: str,
             timeout: float = HANDSHAKE_S, max_body: int = MAX_BODY) -> Channel:
        """The handshake on a connected socket, then the channel; the socket is closed if
        the handshake fails."""
        key = as_key(key)
        check_role(role)
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            return cls(sock, role, handshake(sock, key, role, timeout), max_body)
        except BaseException:
            sock.close()
            raise

    @classmethod
    def connect(cls, address: tuple, key: SessionKey | bytes, role: str,
                timeout: float = HANDSHAKE_S, max_body: int = MAX_BODY) -> Channel:
        """Connect to ``address`` and prove the secret, all within ``timeout``."""
        key = as_key(key)  # bad input is refused before any connection
        check_role(role)
        deadline = time.monotonic() + timeout
        sock = socket.create_connection(address, timeout=timeout)
        return cls.over(sock, key, role, max(0.0, deadline - time.monotonic()), max_body)

    @classmethod
    def accept(cls, server: socket.socket, key: SessionKey | bytes, role: str,
               timeout: float = HANDSHAKE_S, max_body: int = MAX_BODY) -> Channel:
        """The first peer on ``server`` (a listener) that proves the secret within
        ``timeout``; peers that fail (or take over HANDSHAKE_S) are closed and counted, and
        do not end the wait."""
        key, deadline, refused = as_key(key), time.monotonic() + timeout, []
        check_role(role)
        waiting = _poller(server, select.POLLIN)
        while (left := deadline - time.monotonic()) > 0 and waiting.poll(left * 1000):
            sock, address = server.accept()
            try:
                left = deadline - time.monotonic()  # a silent peer holds it up this long:
                return cls.over(sock, key, role, min(HANDSHAKE_S, left), max_body)
            except ChannelError as exc:
                refused.append(f"{address[0]}: {exc}")
        raise ChannelTimeout(f"no peer proved the session's secret within {timeout:.3g} s"
                             + _refusals(refused))

    def fileno(self) -> int:
        return self._sock.fileno()

    @property
    def local_address(self) -> str:
        """This end's IP address: an agent's, the host's address on the controller's network."""
        return self._sock.getsockname()[0]

    @property
    def closed(self) -> bool:
        return self._closed

    def send(self, kind: str, body: bytes = b"", timeout: float = SEND_S) -> None:
        """Send one message; ChannelTimeout (and the channel closed) if the peer has not
        taken it within ``timeout`` seconds."""
        header_kind, body = encode_kind(kind), _as_bytes(body)
        if len(body) > self._decoder.max_body:
            raise ValueError(f"a body of {len(body)} bytes is over the channel's cap of "
                             f"{self._decoder.max_body}: send it in parts")
        with self._send_lock:
            self._check_open()
            header, mac = self._signer.sign(header_kind, body)
            parts = (header, body, mac)
            sent = self._send_now(parts)
            if sent < len(header) + len(body) + len(mac):  # the socket's buffer is full
                self._send_rest(parts, sent, timeout)

    def recv(self, timeout: float | None = None) -> Message:
        """The next message; ``TimeoutError`` (the channel stays open) if none came within
        ``timeout`` seconds; ChannelClosed once the peer has gone."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while not self._ready:
            self._check_open()
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            if not self._poll_in.poll(None if left is None else left * 1000):
                raise TimeoutError(f"no message came within {timeout} s")
            self._ready.extend(self._read(CHUNK))
        return self._ready.popleft()

    def receive_ready(self) -> list[Message]:
        """What has arrived, without waiting (for a selector loop that saw the socket
        readable); ChannelClosed when the peer has gone and nothing is left to hand out."""
        messages = list(self._ready)
        self._ready.clear()
        if not messages:
            self._check_open()
        if not self._closed:
            messages += self._read(READY_BUDGET, stop_at_end=bool(messages))
        return messages

    def close(self) -> None:
        """Close the connection; idempotent."""
        if not self._closed:
            self._closed = True
            self._sock.close()

    def __enter__(self) -> Channel:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self._closed else f"fd {self._sock.fileno()}"
        return f"Channel({self.role}, {state})"

    def _check_open(self) -> None:
        if self._closed:
            raise ChannelClosed("this channel is closed")

    def _read(self, budget: int, stop_at_end: bool = False) -> list[Message]:
        """Read without blocking, up to ``budget`` bytes, and decode. The end of the stream
        raises, unless ``stop_at_end`` (messages are in hand: the end waits for the next call,
        the socket stays readable)."""
        messages = []
        while budget > 0:
            try:
                n = self._sock.recv_into(self._chunk)
            except (BlockingIOError, InterruptedError):
                break
            except OSError as exc:
                self._fail(ChannelClosed(f"the connection broke ({exc.strerror or exc})"))
            if n == 0:
                if stop_at_end or messages:
                    break
                self._fail(self._decoder.end())
            messages += self._decode(self._chunk_view[:n])
            budget -= n
            if n < CHUNK:  # the socket had no more (another recv would only say so)
                break
        return messages

    def _decode(self, data) -> list[Message]:
        try:
            return self._decoder.feed(data)
        except PeerRefused as exc:
            self._fail(exc)

    def _send_now(self, parts) -> int:
        """As much of ``parts`` as the socket takes now, in one system call."""
        try:
            return self._sock.sendmsg(parts)
        except (BlockingIOError, InterruptedError):
            return 0
        except OSError as exc:
            self._fail(ChannelClosed(f"the peer has gone ({exc.strerror or exc})"))

    def _send_rest(self, parts, sent: int, timeout: float) -> None:
        """The rest of a message, as the peer makes room, until ``timeout``."""
        deadline, poller = time.monotonic() + timeout, _poller(self._sock, select.POLLOUT)
        views = _drop_sent([memoryview(p) for p in parts if len(p)], sent)
        while views:
            left = deadline - time.monotonic()
            if left <= 0 or not poller.poll(left * 1000):
                self._fail(ChannelTimeout(
                    f"the peer read nothing for {timeout:.3g} s: the channel is closed (a "
                    "message half sent cannot be taken back)"))
            views = _drop_sent(views, self._send_now(views))

    def _fail(self, error: ChannelError):
        self.close()
        raise error


def _refusals(refused: list[str], shown: int = 3) -> str:
    """The last few refusals, for the error (a flood of them must not make it huge)."""
    if not refused:
        return ""
    return f"; {len(refused)} refused, the last: " + "; ".join(refused[-shown:])


def _as_bytes(body) -> bytes | memoryview:
    """The body as a flat view of its bytes (bytes, bytearray, a contiguous buffer)."""
    if type(body) is bytes:  # the common case, as it is
        return body
    try:
        return memoryview(body).cast("B")
    except TypeError:
        raise TypeError(f"a message body is bytes (pickle objects first), not a "
                        f"{type(body).__name__}") from None


def _poller(sock: socket.socket, event: int):
    poller = select.poll()
    poller.register(sock, event)
    return poller


def _drop_sent(views: list, sent: int) -> list:
    while views and sent >= len(views[0]):
        sent -= len(views.pop(0))
    if sent:
        views[0] = views[0][sent:]
    return views
