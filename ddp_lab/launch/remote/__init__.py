"""The control channel between a notebook (the controller) and the agent on each host that
forks that host's ranks: one TCP connection per host carries calls, replies and live output.

Nothing crosses it unauthenticated. Read in this order:

1. ``secret`` (the session's 32 random bytes: made by the controller, handed to an agent on
   its stdin, never on a command line, in a file, a log, a repr or an error message).
2. ``handshake`` (both sides prove the secret without sending it, over a nonce from each
   side; the connection's two message keys come out of it).
3. ``codec`` (a message as a frame: size cap, per-message HMAC-SHA256 over a sequence
   number, a kind and the body; an incremental decoder, ``feed(bytes) -> [Message]``).
4. ``channel`` (a socket, the handshake and the codec together: blocking ``recv``, reading
   from a selector loop, ``send`` with a deadline) and ``channel_errors``.
5. ``bench_channel`` (a small message's round trip against a raw socket's, and the echo
   peer the tests and the benchmark run as a second process).

Nothing is imported here: an agent imports what it uses.
"""
