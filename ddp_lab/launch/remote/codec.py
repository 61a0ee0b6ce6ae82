"""A message as a frame, and the checks a frame passes before anything reads its body.

    seq u64 | body size u32 | kind 16 bytes | body | HMAC-SHA256(message key, header | body)

The message key is the connection's key for that direction (handshake.py): it binds the
session's secret, both nonces and the direction, so a frame recorded on another connection,
or sent back to its sender, fails its HMAC. The sequence number it covers must be exactly
the next one, so a frame replayed or reordered on the same connection is refused too, and
no history of digests is needed (Jupyter keeps one, jupyter_client/session.py, because its
signature covers neither an order nor a connection). The signed bytes are fixed-size fields
and the body, so no two messages sign alike (Jupyter signs the bare concatenation of its
parts). The body size is checked against a cap as soon as the header is in, before any of
the body is waited for.

The decoder hands out a ``Message`` only once its HMAC and its order are checked; only then
may its body be unpickled (``Message.unpickle``). After one refusal it refuses everything:
a stream that carried a bad frame cannot be trusted to be in step again.
"""

from __future__ import annotations

import hmac
import pickle
import struct
from typing import NamedTuple

from ddp_lab.launch.remote.channel_errors import ChannelClosed, PeerRefused

HEADER = struct.Struct("!QI16s")
MAC_SIZE = 32
KIND_SIZE = 16
# Big enough for the values a course's ranks pull (state dicts of its models), small enough
# that a corrupt size cannot make a process reserve gigabytes.
MAX_BODY = 1 << 28


class Message(NamedTuple):
    """One authenticated message: its kind (a short ASCII name), its body, its place. (A
    named tuple: the cheapest record to make once per message.)"""

    kind: str
    body: bytes
    seq: int = 0

    def unpickle(self):
        """The body as the object it pickles: safe only because the HMAC was checked."""
        return pickle.loads(self.body)

    def __repr__(self) -> str:
        return f"Message({self.kind!r}, {len(self.body)} bytes, seq {self.seq})"


def encode_kind(kind: str) -> bytes:
    """A kind as its header field; bad kinds are the caller's bug, refused before sending."""
    if not isinstance(kind, str) or not kind.isascii() or not 0 < len(kind) <= KIND_SIZE \
            or "\0" in kind:
        raise ValueError(f"a message kind is 1 to {KIND_SIZE} ASCII characters, not "
                         f"{kind!r}")
    return kind.encode("ascii")


class Signer:
    """Signs what one side sends: ``sign(kind, body)`` is the frame's header and HMAC (the
    body travels between them as it is, never copied into a frame)."""

    def __init__(self, key: bytes):
        self._mac = hmac.new(key, digestmod="sha256")
        self._seq = 0

    def sign(self, kind: bytes, body) -> tuple[bytes, bytes]:
        self._seq += 1
        header = HEADER.pack(self._seq, len(body), kind)
        mac = self._mac.copy()
        mac.update(header)
        mac.update(body)
        return header, mac.digest()


class FrameDecoder:
    """Bytes in, authenticated messages out: ``feed(data) -> [Message]``; raises PeerRefused
    at the first frame that fails a check, and from then on at every call. ``end()`` says
    the stream ended: ChannelClosed, which tells a clean end from one in mid-frame."""

    def __init__(self, key: bytes, max_body: int = MAX_BODY):
        self._mac = hmac.new(key, digestmod="sha256")
        self._seq = 0
        self._buffer = bytearray()
        self.max_body = max_body
        self._refused: PeerRefused | None = None

    def feed(self, data) -> list[Message]:
        if self._refused is not None:
            raise self._refused
        if self._buffer:  # a frame begun in an earlier chunk: parse from the buffer
            self._buffer += data
            data = self._buffer
        messages: list[Message] = []
        with memoryview(data) as view:
            try:
                used = self._parse(view, messages)
            except PeerRefused as exc:
                self._refused, self._buffer = exc, bytearray()
                raise
            self._keep(data, view, used)
        return messages

    def end(self) -> ChannelClosed:
        """The error for a stream that ended here (to raise)."""
        if not self._buffer:
            return ChannelClosed("the peer closed the connection")
        return ChannelClosed(f"the peer closed the connection in the middle of a frame "
                             f"({len(self._buffer)} bytes of it came): the link dropped "
                             "or the peer died while sending")

    def _keep(self, data, view: memoryview, used: int) -> None:
        """Keep what follows the last whole frame; a big frame that is still arriving stays
        where it is (copying it again on every chunk would cost time quadratic in its size)."""
        if used == len(view):
            self._buffer = bytearray()
        elif used or data is not self._buffer:
            self._buffer = bytearray(view[used:])

    def _parse(self, view: memoryview, messages: list[Message]) -> int:
        """Append the whole frames at the start of ``view`` to ``messages``, each checked;
        return how many bytes they took."""
        at, size_all = 0, len(view)
        while size_all - at >= HEADER.size:
            seq, size, kind = HEADER.unpack_from(view, at)
            if size > self.max_body:
                raise PeerRefused(f"a frame announces a body of {size} bytes, over this "
                                  f"channel's cap of {self.max_body}: the stream is corrupt "
                                  "or the peer is not a ddp-lab channel")
            body_at = at + HEADER.size
            mac_at = body_at + size
            if mac_at + MAC_SIZE > size_all:
                break
            self._check(view[at:mac_at], view[mac_at:mac_at + MAC_SIZE], seq)
            messages.append(Message(kind.rstrip(b"\0").decode("ascii", "replace"),
                                    bytes(view[body_at:mac_at]), seq))
            at = mac_at + MAC_SIZE
        return at

    def _check(self, signed: memoryview, signature: memoryview, seq: int) -> None:
        mac = self._mac.copy()
        mac.update(signed)
        if not hmac.compare_digest(mac.digest(), signature):
            raise PeerRefused("a message's signature is wrong: it was altered, forged, "
                              "sent back to its sender, or replayed from another connection")
        if seq != self._seq + 1:
            raise PeerRefused(f"message {seq} came where {self._seq + 1} was due: it was "
                              "replayed or reordered")
        self._seq = seq
