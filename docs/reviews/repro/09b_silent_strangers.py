"""Two strangers connect to the controller's port during the start and say nothing. The
controller accepts serially as links.accept_all does (Channel.accept with HANDSHAKE_S each);
the genuine agent connects right after them with the agent's own timeout (agent.CONNECT_S).
Does the agent get in? (No torch, no ssh: the channel code only.)"""
import socket, threading, time

from ddp_lab.launch.remote.agent import CONNECT_S
from ddp_lab.launch.remote.channel import Channel, listener
from ddp_lab.launch.remote.channel_errors import ChannelError, ChannelTimeout
from ddp_lab.launch.remote.handshake import AGENT, CONTROLLER, HANDSHAKE_S
from ddp_lab.launch.remote.secret import SessionKey

def trial(strangers: int) -> None:
    key = SessionKey.new()
    server = listener("127.0.0.1")
    address = server.getsockname()[:2]
    silent = [socket.create_connection(address) for _ in range(strangers)]
    outcome = {}
    def agent():
        t0 = time.monotonic()
        try:
            Channel.connect(address, key, AGENT, timeout=CONNECT_S)
            outcome["agent"] = f"in after {time.monotonic() - t0:.1f} s"
        except ChannelError as exc:
            outcome["agent"] = f"gave up after {time.monotonic() - t0:.1f} s: {type(exc).__name__}"
    thread = threading.Thread(target=agent); thread.start()
    t0 = time.monotonic()
    while thread.is_alive() and time.monotonic() - t0 < 60:
        try:
            Channel.accept(server, key, CONTROLLER, timeout=HANDSHAKE_S)
            outcome["controller"] = f"accepted the agent after {time.monotonic() - t0:.1f} s"
            break
        except ChannelTimeout:
            continue
    thread.join()
    print(f"{strangers} silent stranger(s): {outcome}")
    for s in silent: s.close()
    server.close()

for n in (1, 2):
    trial(n)
