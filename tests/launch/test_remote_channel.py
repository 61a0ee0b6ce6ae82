"""The control channel between a notebook and its host agents (launch/remote/), attacked for
real: TCP sockets on 127.0.0.1, a second process where it matters (the echo peer of
bench_channel, its secret on its stdin), and a man in the middle (``Relay``) that records,
replays, reflects and alters what passes. Every refusal closes the connection and quotes no
secret; no test leaves a socket, a thread or a process behind."""

from __future__ import annotations

import contextlib
import os
import pickle
import selectors
import socket
import threading
import time

import pytest

from ddp_lab.launch.remote.bench_channel import REFUSED, echo_peer, round_trip
from ddp_lab.launch.remote.channel import Channel, listener
from ddp_lab.launch.remote.channel_errors import ChannelClosed, ChannelTimeout, PeerRefused
from ddp_lab.launch.remote.codec import HEADER, FrameDecoder, Signer
from ddp_lab.launch.remote.handshake import AGENT, CONTROLLER, GREETING, handshake
from ddp_lab.launch.remote.secret import SessionKey, read_secret, write_secret

WAIT_S = 20.0  # generous: only a broken channel ever waits this long
HANDSHAKE_OUT = len(GREETING) + 32 + 32  # what a controller sends before its first frame


@pytest.fixture(autouse=True)
def nothing_left():
    """No socket (or other descriptor) and no thread outlives a test."""
    fds, threads = set(os.listdir("/proc/self/fd")), set(threading.enumerate())
    yield
    deadline = time.monotonic() + WAIT_S
    while set(threading.enumerate()) - threads and time.monotonic() < deadline:
        time.sleep(0.01)
    assert set(threading.enumerate()) - threads == set()
    assert set(os.listdir("/proc/self/fd")) - fds == set()


class Background:
    """``fn(*args)`` in a thread; ``result()`` joins it and returns or raises what it did."""

    def __init__(self, fn, *args, **kwargs):
        self._out: dict = {}
        self._thread = threading.Thread(target=self._run, args=(fn, args, kwargs))
        self._thread.start()

    def _run(self, fn, args, kwargs):
        try:
            self._out["value"] = fn(*args, **kwargs)
        except BaseException as exc:  # handed to the test by result()
            self._out["error"] = exc

    def result(self):
        self._thread.join(WAIT_S)
        assert not self._thread.is_alive(), "the background call did not end"
        if "error" in self._out:
            raise self._out["error"]
        return self._out["value"]


class Relay:
    """A man in the middle: forwards a controller's connection to ``target`` both ways,
    records what passes, injects bytes, and flips one bit of the controller's stream at
    ``flip_at`` (an offset in that stream) when asked."""

    def __init__(self, target: tuple, flip_at: int | None = None):
        self.server = listener("127.0.0.1")
        self.address, self.target, self.flip_at = self.server.getsockname(), target, flip_at
        self.seen = {"to_agent": bytearray(), "to_controller": bytearray()}
        self.lock, self.stopping = threading.Lock(), threading.Event()
        self.connected = threading.Event()
        self.thread = threading.Thread(target=self._run)
        self.thread.start()

    def inject(self, direction: str, data: bytes) -> None:
        with self.lock:
            (self.agent if direction == "to_agent" else self.controller).sendall(data)

    def close(self) -> None:
        self.stopping.set()
        self.thread.join(WAIT_S)
        for sock in (self.server, getattr(self, "controller", None),
                     getattr(self, "agent", None)):
            if sock is not None:
                sock.close()

    def _run(self) -> None:
        self.server.settimeout(WAIT_S)
        self.controller, _ = self.server.accept()
        self.agent = socket.create_connection(self.target)
        self.connected.set()
        with selectors.DefaultSelector() as selector:
            selector.register(self.controller, selectors.EVENT_READ, "to_agent")
            selector.register(self.agent, selectors.EVENT_READ, "to_controller")
            while not self.stopping.is_set() and selector.get_map():
                for key, _ in selector.select(0.02):
                    self._forward(selector, key.fileobj, key.data)

    def _forward(self, selector, source: socket.socket, direction: str) -> None:
        sink = self.agent if direction == "to_agent" else self.controller
        try:
            data = bytearray(source.recv(1 << 16))
        except OSError:
            data = bytearray()
        if not data:
            selector.unregister(source)
            with contextlib.suppress(OSError):
                sink.shutdown(socket.SHUT_WR)
            return
        at = self.flip_at - len(self.seen[direction]) if self.flip_at is not None else -1
        if direction == "to_agent" and 0 <= at < len(data):
            data[at] ^= 0x01
        self.seen[direction] += data
        with self.lock, contextlib.suppress(OSError):
            sink.sendall(data)


@contextlib.contextmanager
def relayed(key: SessionKey | None = None, flip_at: int | None = None):
    """A controller's channel and an agent's, with a Relay between them."""
    key = key or SessionKey.new()
    with listener("127.0.0.1") as server:
        agent = Background(Channel.accept, server, key, AGENT, timeout=WAIT_S)
        relay = Relay(server.getsockname(), flip_at)
        try:
            controller = Channel.connect(relay.address, key, CONTROLLER)
            with controller, agent.result() as agent_chan:
                yield controller, agent_chan, relay
        finally:
            relay.close()


@contextlib.contextmanager
def direct_pair():
    """A controller's channel and an agent's, connected straight."""
    key = SessionKey.new()
    with listener("127.0.0.1") as server:
        agent = Background(Channel.accept, server, key, AGENT, timeout=WAIT_S)
        with Channel.connect(server.getsockname(), key, CONTROLLER) as controller, \
                agent.result() as agent_chan:
            yield controller, agent_chan


@contextlib.contextmanager
def authenticated_raw_controller(**agent_options):
    """A controller that holds the key but writes raw bytes after the handshake, and the
    agent's channel: a legitimate peer gone bad, or a test writing frames by hand."""
    key = SessionKey.new()
    with listener("127.0.0.1") as server:
        agent = Background(Channel.accept, server, key, AGENT, timeout=WAIT_S,
                           **agent_options)
        with socket.create_connection(server.getsockname()) as sock:
            keys = handshake(sock, key, CONTROLLER)
            sock.setblocking(True)
            with agent.result() as agent_chan:
                yield sock, Signer(keys.send), agent_chan, key


def frame(signer: Signer, kind: str, body: bytes) -> bytes:
    header, mac = signer.sign(kind.encode(), body)
    return header + body + mac


def assert_secret_free(text: str, key: SessionKey) -> None:
    raw = key._raw
    assert raw.hex() not in text and repr(raw)[2:-1] not in text


def assert_refused(chan: Channel, match: str, key: SessionKey | None = None):
    with pytest.raises(PeerRefused, match=match) as info:
        chan.recv(timeout=WAIT_S)
    assert chan.closed
    if key is not None:
        assert_secret_free(str(info.value) + repr(info.value), key)
    return info.value


# -- good traffic -----------------------------------------------------------------------------
def test_round_trip_both_ways_with_an_agent_process():
    key = SessionKey.new()
    with listener("127.0.0.1") as server, echo_peer(server.getsockname(), key) as peer:
        with Channel.accept(server, key, CONTROLLER, timeout=WAIT_S) as chan:
            with open(f"/proc/{peer.pid}/cmdline", "rb") as f:  # it runs, it has the key
                cmdline = f.read()
            for i, body in enumerate([b"", b"x", os.urandom(70_000), os.urandom(3 << 20)]):
                chan.send("echo", body)
                back = chan.recv(timeout=WAIT_S)
                assert (back.kind, back.body, back.seq) == ("echo", body, i + 1)
            chan.send("call", pickle.dumps({"fn": "step", "args": (1, 2.5)}))
            assert chan.recv(timeout=WAIT_S).unpickle() == {"fn": "step", "args": (1, 2.5)}
            chan.send("bye")
        assert peer.wait(WAIT_S) == 0
    assert key._raw.hex().encode() not in cmdline  # the secret went on its stdin


def test_a_selector_loop_reads_every_message_in_order():
    with relayed() as (controller, agent, _):
        sent = [os.urandom(n) for n in (0, 1, 10, 1000, 300_000, 5)]
        for body in sent:
            agent.send("output", body)
        got = []
        with selectors.DefaultSelector() as selector:
            selector.register(controller, selectors.EVENT_READ)
            while len(got) < len(sent):
                assert selector.select(WAIT_S), "the channel never became readable"
                got += controller.receive_ready()
        assert [m.body for m in got] == sent and [m.seq for m in got] == [1, 2, 3, 4, 5, 6]
        controller.send("call", b"ping")
        assert agent.recv(timeout=WAIT_S).body == b"ping"


def test_a_recv_that_times_out_leaves_the_channel_open():
    with relayed() as (controller, agent, _):
        with pytest.raises(TimeoutError) as info:
            agent.recv(timeout=0.05)
        assert not isinstance(info.value, ChannelClosed) and not agent.closed
        controller.send("call", b"late")
        assert agent.recv(timeout=WAIT_S).body == b"late"


def test_messages_then_the_end_of_the_stream():
    with relayed() as (controller, agent, _):
        for i in range(3):
            agent.send("output", bytes([i]))
        agent.close()
        got = []
        while len(got) < 3:
            got += controller.receive_ready() or [controller.recv(timeout=WAIT_S)]
        assert [m.body for m in got] == [b"\0", b"\1", b"\2"]
        with pytest.raises(ChannelClosed, match="the peer closed the connection$"):
            controller.recv(timeout=WAIT_S)


def test_the_decoder_gives_the_same_messages_whatever_the_chunks():
    key, bodies = os.urandom(32), [b"", b"a" * 5, os.urandom(1000)]
    signer = Signer(key)
    stream = b"".join(frame(signer, f"k{i}", body) for i, body in enumerate(bodies))
    for size in (1, 7, 28, 100, len(stream)):
        decoder = FrameDecoder(key)
        got = [m for at in range(0, len(stream), size) for m in decoder.feed(stream[at:at + size])]
        assert [(m.kind, m.body, m.seq) for m in got] == [(f"k{i}", b, i + 1)
                                                          for i, b in enumerate(bodies)]
        assert str(decoder.end()) == "the peer closed the connection"


# -- the handshake ----------------------------------------------------------------------------
def test_an_agent_with_a_wrong_key_is_refused_by_the_controller():
    key = SessionKey.new()
    with listener("127.0.0.1") as server, \
            echo_peer(server.getsockname(), SessionKey.new()) as peer:
        server.settimeout(WAIT_S)
        sock, _ = server.accept()
        with pytest.raises(PeerRefused, match="the agent did not prove") as info:
            Channel.over(sock, key, CONTROLLER)
        assert sock.fileno() == -1  # closed
        assert peer.wait(WAIT_S) == REFUSED
        assert "closed the connection during the handshake" in peer.stderr.read().decode()
    assert_secret_free(str(info.value), key)


def test_an_agent_refuses_a_controller_with_a_wrong_key():
    key = SessionKey.new()
    with listener("127.0.0.1") as server, \
            echo_peer(server.getsockname(), SessionKey.new(), role=CONTROLLER) as peer:
        server.settimeout(WAIT_S)
        sock, _ = server.accept()
        with pytest.raises(PeerRefused, match="the controller closed the connection during"):
            Channel.over(sock, key, AGENT)  # the controller checked first: it hung up
        assert peer.wait(WAIT_S) == REFUSED
        assert "the agent did not prove" in peer.stderr.read().decode()


def test_an_agent_refuses_a_controller_whose_proof_is_wrong():
    with listener("127.0.0.1") as server, \
            socket.create_connection(server.getsockname()) as impostor:
        agent = Background(Channel.over, server.accept()[0], SessionKey.new(), AGENT)
        impostor.sendall(GREETING + os.urandom(32))
        assert len(impostor.recv(HANDSHAKE_OUT)) > 0
        impostor.sendall(os.urandom(32))  # a guessed proof
        with pytest.raises(PeerRefused, match="the controller did not prove"):
            agent.result()


def test_accept_goes_on_past_a_refused_peer():
    key = SessionKey.new()
    with listener("127.0.0.1") as server:
        controller = Background(Channel.accept, server, key, CONTROLLER, timeout=WAIT_S)
        with socket.create_connection(server.getsockname()) as stranger:
            stranger.sendall(b"GET / HTTP/1.1\r\n\r\n" * 5)
            with Channel.connect(server.getsockname(), key, AGENT) as agent, \
                    controller.result() as chan:
                agent.send("hello", b"it is me")
                assert chan.recv(timeout=WAIT_S).body == b"it is me"


def test_garbage_at_the_handshake_is_refused_by_an_agent_process():
    with listener("127.0.0.1") as server, \
            echo_peer(server.getsockname(), SessionKey.new()) as peer:
        server.settimeout(WAIT_S)
        with server.accept()[0] as sock:
            sock.sendall(os.urandom(200))
            assert peer.wait(WAIT_S) == REFUSED
        assert "is not a ddp-lab controller" in peer.stderr.read().decode()


def test_a_silent_peer_is_dropped_at_the_handshake_deadline():
    with listener("127.0.0.1") as server, socket.create_connection(server.getsockname()):
        with pytest.raises(ChannelTimeout, match="1 refused.*the handshake did not finish"):
            Channel.accept(server, SessionKey.new(), AGENT, timeout=0.3)


def test_a_dribbling_peer_is_dropped_at_the_handshake_deadline():
    with listener("127.0.0.1") as server, \
            socket.create_connection(server.getsockname()) as dribbler:
        sock, _ = server.accept()
        agent = Background(Channel.over, sock, SessionKey.new(), AGENT, timeout=0.5)
        with contextlib.suppress(OSError):  # the agent hangs up at its deadline
            for byte in GREETING * 100:
                dribbler.send(bytes([byte]))
                time.sleep(0.02)
        with pytest.raises(ChannelTimeout, match="a silent or too slow peer is dropped"):
            agent.result()


def test_a_recorded_handshake_cannot_be_replayed_on_a_new_connection():
    key = SessionKey.new()
    with relayed(key) as (controller, agent, relay):
        controller.send("call", b"run the cell")
        agent.recv(timeout=WAIT_S)
        recording = bytes(relay.seen["to_agent"])
    with listener("127.0.0.1") as server, \
            socket.create_connection(server.getsockname()) as replayer:
        fresh = Background(Channel.over, server.accept()[0], key, AGENT)
        replayer.sendall(recording)  # the same secret, a new nonce from the agent
        with pytest.raises(PeerRefused, match="the controller did not prove"):
            fresh.result()


# -- messages -----------------------------------------------------------------------------------
def test_a_frame_replayed_on_the_same_connection_is_refused():
    with relayed() as (controller, agent, relay):
        controller.send("call", b"rm -rf checkpoints")
        assert agent.recv(timeout=WAIT_S).seq == 1
        relay.inject("to_agent", bytes(relay.seen["to_agent"][HANDSHAKE_OUT:]))
        assert_refused(agent, "message 1 came where 2 was due: it was replayed or reordered")


def test_a_frame_replayed_on_another_connection_is_refused():
    with relayed() as (controller, agent, relay):
        controller.send("call", b"x")
        agent.recv(timeout=WAIT_S)
        captured = bytes(relay.seen["to_agent"][HANDSHAKE_OUT:])
    with relayed() as (controller, agent, relay):
        relay.inject("to_agent", captured)  # seq 1, due next: only the keys differ
        assert_refused(agent, "signature is wrong")


def test_a_frame_sent_back_to_its_sender_is_refused():
    with relayed() as (controller, agent, relay):
        controller.send("call", b"x")
        agent.recv(timeout=WAIT_S)
        relay.inject("to_controller", bytes(relay.seen["to_agent"][HANDSHAKE_OUT:]))
        assert_refused(controller, "signature is wrong")


def test_reordered_frames_are_refused():
    with authenticated_raw_controller() as (sock, signer, agent, key):
        first, second = frame(signer, "call", b"1"), frame(signer, "call", b"2")
        sock.sendall(second + first)
        assert_refused(agent, "message 2 came where 1 was due", key)


@pytest.mark.parametrize("field,offset", [("seq", 7), ("size", 11), ("kind", 12),
                                          ("body", HEADER.size + 3),
                                          ("mac", HEADER.size + 10 + 31)])
def test_one_flipped_bit_is_refused(field, offset):
    with relayed(flip_at=HANDSHAKE_OUT + offset) as (controller, agent, _):
        controller.send("call", b"0123456789")
        controller.send("call", bytes(64))  # a shortened size waits for these bytes
        assert_refused(agent, "signature is wrong")


def test_a_forged_frame_is_refused_and_never_unpickled(tmp_path):
    target = tmp_path / "written-by-unpickling"
    with authenticated_raw_controller() as (sock, _, agent, key):
        body = pickle.dumps(WritesAFile(str(target)))
        sock.sendall(HEADER.pack(1, len(body), b"call") + body + os.urandom(32))
        assert_refused(agent, "signature is wrong", key)
    assert not target.exists()


def test_an_agent_process_unpickles_only_what_is_signed(tmp_path):
    target, key = tmp_path / "written-by-unpickling", SessionKey.new()
    body = pickle.dumps(WritesAFile(str(target)))
    with listener("127.0.0.1") as server, \
            echo_peer(server.getsockname(), key, unpickle=True) as peer:
        server.settimeout(WAIT_S)
        with server.accept()[0] as sock:
            handshake(sock, key, CONTROLLER)
            sock.setblocking(True)
            sock.sendall(HEADER.pack(1, len(body), b"call") + body + bytes(32))
            assert peer.wait(WAIT_S) == REFUSED
        assert "signature is wrong" in peer.stderr.read().decode()
    assert not target.exists()
    with listener("127.0.0.1") as server, \
            echo_peer(server.getsockname(), key, unpickle=True) as peer, \
            Channel.accept(server, key, CONTROLLER, timeout=WAIT_S) as chan:
        chan.send("call", body)  # signed: the same pickle does write (the test can fail)
        chan.recv(timeout=WAIT_S)
        chan.send("bye")
        assert peer.wait(WAIT_S) == 0
    assert target.exists()


class WritesAFile:
    """A pickle whose loading creates a file: proof of whether it was unpickled."""

    def __init__(self, path: str):
        self.path = path

    def __reduce__(self):
        return open, (self.path, "w")


def test_garbage_after_the_handshake_is_refused():
    with authenticated_raw_controller() as (sock, _, agent, key):
        sock.sendall(b"\xff" * 100)
        assert_refused(agent, "over this channel's cap", key)


def test_a_huge_length_prefix_is_refused_before_its_body():
    with authenticated_raw_controller(max_body=1 << 20) as (sock, _, agent, key):
        sock.sendall(HEADER.pack(1, (1 << 20) + 1, b"call"))  # the header alone
        assert_refused(agent, f"body of {(1 << 20) + 1} bytes, over this channel's cap of "
                              f"{1 << 20}", key)


def test_a_truncated_frame_then_close():
    with authenticated_raw_controller() as (sock, signer, agent, _):
        sock.sendall(frame(signer, "call", b"whole") + frame(signer, "call", bytes(100))[:50])
        sock.close()
        assert agent.recv(timeout=WAIT_S).body == b"whole"
        with pytest.raises(ChannelClosed, match="in the middle of a frame \\(50 bytes"):
            agent.recv(timeout=WAIT_S)
        assert agent.closed


def test_a_send_to_a_peer_that_reads_nothing_ends_at_its_deadline():
    with direct_pair() as (controller, agent):
        body = bytes(1 << 20)
        with pytest.raises(ChannelTimeout, match="the peer read nothing for 0.5 s"):
            for _ in range(1000):  # loopback buffers hold a few MiB, not a GiB
                controller.send("output", body, timeout=0.5)
        assert controller.closed
        with pytest.raises(ChannelClosed, match="this channel is closed"):
            controller.send("output", b"")


# -- the secret and bad input -------------------------------------------------------------------
def test_the_secret_travels_on_a_descriptor_and_hides_itself():
    key = SessionKey.new()
    read_end, write_end = os.pipe()
    try:
        write_secret(write_end, key)
        os.write(write_end, b"what follows is not the secret's")
        got = read_secret(read_end, timeout=WAIT_S)
        assert got.mac(b"x") == key.mac(b"x")
        assert os.read(read_end, 100) == b"what follows is not the secret's"
    finally:
        os.close(read_end)
        os.close(write_end)
    assert repr(key) == str(key) == "SessionKey(<hidden>)"
    with pytest.raises(TypeError, match="never pickled"):
        pickle.dumps(key)


@pytest.mark.parametrize("line,error", [(b"zz" * 32 + b"\n", "not 64 hex digits"),
                                        (b"ab" * 10, "ended after 20 of 65 bytes")])
def test_a_bad_secret_line_is_refused_without_quoting_it(line, error):
    read_end, write_end = os.pipe()
    try:
        os.write(write_end, line)
        os.close(write_end)
        with pytest.raises(ValueError, match=error) as info:
            read_secret(read_end)
        assert line.decode()[:20] not in str(info.value)
    finally:
        os.close(read_end)


def test_a_secret_that_does_not_come_times_out():
    read_end, write_end = os.pipe()
    try:
        with pytest.raises(TimeoutError, match="did not come in time"):
            read_secret(read_end, timeout=0.05)
    finally:
        os.close(read_end)
        os.close(write_end)


@pytest.mark.parametrize("call,error", [
    (lambda: SessionKey(b"short"), "32 bytes, this one has 5"),
    (lambda: SessionKey("a" * 32), "not a str"),
    (lambda: Channel.connect(("127.0.0.1", 9), SessionKey.new(), "boss"), "not 'boss'"),
    (lambda: listener("0.0.0.0"), "every interface"),
])
def test_bad_input_is_refused_before_any_connection(call, error):
    with pytest.raises((TypeError, ValueError), match=error):
        call()


def test_bad_messages_are_refused_before_sending():
    with relayed() as (controller, agent, _):
        for kind, body, error in [("a-kind-longer-than-16", b"", "1 to 16 ASCII"),
                                  ("é", b"", "1 to 16 ASCII"), ("call", "text", "not a str")]:
            with pytest.raises((TypeError, ValueError), match=error):
                controller.send(kind, body)
        controller.send("call", b"still fine")
        assert agent.recv(timeout=WAIT_S).body == b"still fine"


def test_the_benchmark_measures_both_round_trips():
    result = round_trip(count=50, size=64, rounds=1)
    assert result.channel_us > 0 and result.raw_us > 0 and result.count == 50
