"""The handshake: both sides prove they hold the session's secret without sending it, and
derive the connection's two message keys.

    controller -> agent       GREETING | nonce_c
    agent -> controller       GREETING | nonce_a | HMAC(secret, AGENT_PROOF | nonce_c | nonce_a)
    controller -> agent       HMAC(secret, CONTROLLER_PROOF | nonce_c | nonce_a)

Each side checks the other's proof (``hmac.compare_digest``) and closes at the first wrong
byte; the controller checks first, so an agent never hears anything it could use from a
controller that holds another secret. Each proof covers the nonce the checking side just
drew, so a recorded handshake proves nothing on a new connection; the proofs carry a
different tag per role, so one cannot be sent back to its maker. Who connected to whom does
not matter: the roles do.

The message keys are ``HMAC(secret, tag of the direction | nonce_c | nonce_a)``: a message
signed on one connection, or in one direction, does not verify on another (codec.py).
The whole handshake has one deadline: a peer that says nothing, or a byte a second, is
dropped when it passes. This authenticates; it does not encrypt (as Jupyter's signing).
"""

from __future__ import annotations

import hmac
import select
import secrets
import socket
import time
from dataclasses import dataclass

from ddp_lab.launch.remote.channel_errors import ChannelTimeout, PeerRefused
from ddp_lab.launch.remote.secret import SessionKey

CONTROLLER, AGENT = "controller", "agent"
GREETING = b"ddp-lab channel1"  # 16 bytes: which protocol, which version
NONCE = 32
PROOF = 32
DOMAIN = b"ddp-lab/channel/1"
AGENT_PROOF, CONTROLLER_PROOF = b"\x01", b"\x02"
TO_AGENT, TO_CONTROLLER = b"\x03", b"\x04"
HANDSHAKE_S = 10.0  # a healthy peer answers in milliseconds, even over ssh's slow starts


@dataclass(frozen=True, repr=False)
class MessageKeys:
    """The connection's keys: one to sign what this side sends, one to check what it gets."""

    send: bytes
    receive: bytes

    def __repr__(self) -> str:
        return "MessageKeys(<hidden>)"


def handshake(sock: socket.socket, key: SessionKey, role: str,
              timeout: float = HANDSHAKE_S) -> MessageKeys:
    """Run the handshake on a connected socket as ``role`` (CONTROLLER or AGENT). Raises
    PeerRefused (the peer proved nothing, or is no ddp-lab peer) or ChannelTimeout; the
    caller closes the socket then."""
    check_role(role)
    sock.setblocking(False)
    wire = _Wire(sock, time.monotonic() + timeout, timeout)
    if role == CONTROLLER:
        return _as_controller(wire, key)
    return _as_agent(wire, key)


def check_role(role: str) -> None:
    if role not in (CONTROLLER, AGENT):
        raise ValueError(f"a channel's role is {CONTROLLER!r} or {AGENT!r}, not {role!r}")


def _as_controller(wire: _Wire, key: SessionKey) -> MessageKeys:
    nonce_c = secrets.token_bytes(NONCE)
    wire.send(GREETING + nonce_c)
    reply = wire.read(len(GREETING) + NONCE + PROOF, AGENT)
    _check_greeting(reply, AGENT)
    nonce_a, proof = reply[len(GREETING):-PROOF], reply[-PROOF:]
    if not hmac.compare_digest(proof, key.mac(DOMAIN, AGENT_PROOF, nonce_c, nonce_a)):
        raise PeerRefused("the agent did not prove this session's secret: it holds another "
                          "session's key, or it is not this session's agent")
    wire.send(key.mac(DOMAIN, CONTROLLER_PROOF, nonce_c, nonce_a))
    return _keys(key, nonce_c, nonce_a, send=TO_AGENT, receive=TO_CONTROLLER)


def _as_agent(wire: _Wire, key: SessionKey) -> MessageKeys:
    hello = wire.read(len(GREETING) + NONCE, CONTROLLER)
    _check_greeting(hello, CONTROLLER)
    nonce_c, nonce_a = hello[len(GREETING):], secrets.token_bytes(NONCE)
    wire.send(GREETING + nonce_a + key.mac(DOMAIN, AGENT_PROOF, nonce_c, nonce_a))
    proof = wire.read(PROOF, CONTROLLER)
    if not hmac.compare_digest(proof, key.mac(DOMAIN, CONTROLLER_PROOF, nonce_c, nonce_a)):
        raise PeerRefused("the controller did not prove this session's secret: it holds "
                          "another session's key, or it is not this session's controller")
    return _keys(key, nonce_c, nonce_a, send=TO_CONTROLLER, receive=TO_AGENT)


def _keys(key: SessionKey, nonce_c: bytes, nonce_a: bytes, send: bytes,
          receive: bytes) -> MessageKeys:
    return MessageKeys(send=key.mac(DOMAIN, send, nonce_c, nonce_a),
                       receive=key.mac(DOMAIN, receive, nonce_c, nonce_a))


def _check_greeting(data: bytes, peer: str) -> None:
    if not data.startswith(GREETING):  # what came is described, never quoted
        raise PeerRefused(f"the peer is not a ddp-lab {peer}: its first bytes are not the "
                          "channel's greeting (another program on this port, or another "
                          "version of ddp-lab)")


class _Wire:
    """The handshake's reads and writes on a non-blocking socket, all under one deadline."""

    def __init__(self, sock: socket.socket, deadline: float, timeout: float):
        self.sock, self.deadline, self.timeout = sock, deadline, timeout

    def send(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            self._wait(select.POLLOUT, "send its part")
            view = view[self._io(lambda: self.sock.send(view), 0):]

    def read(self, size: int, peer: str) -> bytes:
        """Exactly ``size`` bytes and no more (what follows is the channel's, not ours)."""
        data = b""
        while len(data) < size:
            self._wait(select.POLLIN, f"hear from the {peer}")
            chunk = self._io(lambda: self.sock.recv(size - len(data)), None)
            if chunk == b"":
                raise PeerRefused(f"the {peer} closed the connection during the handshake "
                                  f"({len(data)} of {size} bytes came): it refused this "
                                  "side's proof (the two sides hold different secrets), "
                                  "or it is not a ddp-lab peer")
            data += chunk or b""
        return data

    def _wait(self, event: int, what: str) -> None:
        poller = select.poll()
        poller.register(self.sock, event)
        left = self.deadline - time.monotonic()
        if left <= 0 or not poller.poll(left * 1000):
            raise ChannelTimeout(f"the handshake did not finish within {self.timeout:.3g} s "
                                 f"(waiting to {what}): a silent or too slow peer is "
                                 "dropped")

    @staticmethod
    def _io(call, would_block):
        try:
            return call()
        except (BlockingIOError, InterruptedError):
            return would_block
        except OSError as exc:
            reason = exc.strerror or type(exc).__name__
            raise PeerRefused(f"the connection broke during the handshake ({reason})") from None
