"""Ranks on several hosts: the control channel between a notebook (the controller) and the
agent on each host that forks that host's ranks: one TCP connection per host carries calls,
replies and live output.

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

On it, live ranks on several hosts (``ddp_lab.Ranks(hosts=[...])``, ``ddp_lab.run(...,
hosts=...)``):

6. ``messages`` (what the controller and an agent say, and times as ages across clocks).
7. ``launchers`` (``via=``: ssh, srun or a template; the agent's command line; the checks
   of ``hosts=``), ``startup`` (secret, listener, launchers, channels, beats) and ``links``
   (each host's launcher and channel, read by a thread into one queue).
8. ``agent`` (on each host: connects back, proves the secret, does what it is asked, and
   exits with everything of its host when the controller goes silent) and ``host_ranks``
   (the host's share of ranks as a local ``LiveSession`` numbered globally).
9. ``session`` (the controller's ``RemoteSession``: the session contract across hosts;
   failures, hangs, the stop button and a lost host handled as one machine handles them)
   and ``one_shot`` (``ddp_lab.run`` on hosts).

Nothing is imported here: an agent imports what it uses.
"""
