"""The session's secret: 32 random bytes the controller makes for one session and hands to
each agent on the agent's stdin (through ssh or srun, which carry stdin over their own
authenticated link), never on a command line (``ps`` shows it to every user) or in a file.

``SessionKey`` holds the bytes and hides them: its repr shows none, it refuses to be pickled
(a pickle ends up in files and logs), and only ``mac`` (for the handshake) and
``write_secret`` (for an agent's stdin) ever use them.
"""

from __future__ import annotations

import binascii
import hmac
import os
import secrets
import select
import time

SIZE = 32
# On the agent's stdin: 64 hex digits and a newline (text-safe through any engine's stdin).
LINE_SIZE = 2 * SIZE + 1


class SessionKey:
    """One session's secret. ``SessionKey.new()`` in the controller; ``read_secret(0)`` in
    an agent; ``SessionKey(raw)`` from 32 bytes the caller already holds."""

    __slots__ = ("_raw",)

    def __init__(self, raw: bytes):
        if not isinstance(raw, (bytes, bytearray)):
            raise TypeError(f"a session key is 32 bytes, not a {type(raw).__name__}: make "
                            "one with SessionKey.new()")
        if len(raw) != SIZE:
            raise ValueError(f"a session key is {SIZE} bytes, this one has {len(raw)}: make "
                             "one with SessionKey.new()")
        self._raw = bytes(raw)

    @classmethod
    def new(cls) -> SessionKey:
        return cls(secrets.token_bytes(SIZE))

    def mac(self, *parts: bytes) -> bytes:
        """HMAC-SHA256 of the parts' concatenation under the secret (callers pass fixed-size
        parts, so the concatenation is unambiguous)."""
        return hmac.digest(self._raw, b"".join(parts), "sha256")

    def __repr__(self) -> str:
        return "SessionKey(<hidden>)"

    def __reduce__(self):
        raise TypeError("a SessionKey is never pickled: hand it to an agent with "
                        "write_secret(fd, key) on the agent's stdin")


def as_key(key: SessionKey | bytes) -> SessionKey:
    """The API takes the secret as bytes or as a SessionKey; inside, it is a SessionKey."""
    return key if isinstance(key, SessionKey) else SessionKey(key)


def write_secret(fd: int, key: SessionKey | bytes) -> None:
    """Write the secret to ``fd`` (the agent's stdin pipe) as one line of hex."""
    line = memoryview(binascii.hexlify(as_key(key)._raw) + b"\n")
    while line:
        line = line[os.write(fd, line):]


def read_secret(fd: int = 0, timeout: float | None = None) -> SessionKey:
    """Read the secret ``write_secret`` wrote to ``fd``, exactly its line and no byte more
    (what follows on stdin is not ours to take)."""
    deadline = None if timeout is None else time.monotonic() + timeout
    line = b""
    while len(line) < LINE_SIZE:
        _wait_readable(fd, deadline, len(line))
        chunk = os.read(fd, LINE_SIZE - len(line))
        if not chunk:
            raise ValueError(f"the secret ended after {len(line)} of {LINE_SIZE} bytes: the "
                             "controller writes it on the agent's stdin with write_secret")
        line += chunk
    return _parse(line)


def _wait_readable(fd: int, deadline: float | None, have: int) -> None:
    if deadline is None:
        return
    if not select.select([fd], [], [], max(0.0, deadline - time.monotonic()))[0]:
        raise TimeoutError(f"the secret did not come in time ({have} of {LINE_SIZE} bytes "
                           "read): the controller writes it on the agent's stdin")


def _parse(line: bytes) -> SessionKey:
    try:
        raw = binascii.unhexlify(line[:-1]) if line.endswith(b"\n") else b""
    except binascii.Error:
        raw = b""
    if len(raw) != SIZE:  # the line itself is never quoted: it may be a secret, mistyped
        raise ValueError(f"the secret is not {2 * SIZE} hex digits and a newline: the "
                         "controller writes it on the agent's stdin with write_secret")
    return SessionKey(raw)
