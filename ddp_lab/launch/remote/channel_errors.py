"""What a channel raises. Every one of them means the connection is closed (a channel
never goes on after a refusal: a stream that carried one bad byte cannot be trusted to be
in step again), except the plain ``TimeoutError`` of a ``recv`` that waited in vain.

None of them ever quotes the secret or a key derived from it; a refusal quotes nothing the
peer sent either (garbage is described, not echoed), so a log of errors leaks nothing.
"""

from __future__ import annotations


class ChannelError(ConnectionError):
    """The channel is closed; the message says why and what to look at."""


class ChannelClosed(ChannelError):
    """The peer went away (end of stream, reset), or this side closed the channel."""


class PeerRefused(ChannelError):
    """The peer failed a check: it did not prove the session's secret, a message's signature
    or order was wrong, a frame was oversized, or what came was no channel traffic at all."""


class ChannelTimeout(ChannelError, TimeoutError):
    """The handshake did not finish in time (a silent or dribbling peer is dropped), or the
    peer read nothing for as long as a send could wait."""
