"""ddp_lab.Network's input: what it accepts, and the clear errors for what it does not,
all before any process starts."""

from __future__ import annotations

import psutil
import pytest

import ddp_lab
import workers
from ddp_lab.launch.network.setting import Network, check_network, parse_bandwidth, parse_latency


@pytest.mark.parametrize("text, bits", [
    ("200mbit", 200e6), ("1gbit", 1e9), ("10gbit", 10e9), ("1.5gbit", 1.5e9),
    ("500000kbit", 500e6), (" 2 Gbit ", 2e9), (1e9, 1e9), (300_000_000, 300e6)])
def test_bandwidth_in_tc_units_or_bits_per_second(text, bits):
    assert parse_bandwidth(text) == pytest.approx(bits)


@pytest.mark.parametrize("text, seconds", [
    ("100us", 1e-4), ("1ms", 1e-3), ("0.5ms", 5e-4), (0.002, 2e-3), (None, None)])
def test_latency_in_tc_units_or_seconds(text, seconds):
    assert parse_latency(text) == pytest.approx(seconds) if seconds else parse_latency(text) is None


@pytest.mark.parametrize("kwargs, error, words", [
    ({"bandwidth": "fast"}, ValueError, "'200mbit', '1gbit'"),
    ({"bandwidth": "25mbps"}, ValueError, "not understood"),
    ({"bandwidth": "10kbit"}, ValueError, "use 1mbit to 100gbit"),
    ({"bandwidth": "1tbit"}, ValueError, "not understood"),
    ({"bandwidth": True}, TypeError, "must be a string"),
    ({"bandwidth": [1]}, TypeError, "must be a string"),
    ({"latency": "2s"}, ValueError, "at most 1s"),
    ({"latency": "-1ms"}, ValueError, "not understood"),
    ({"rank_bandwidth": [1]}, TypeError, "dict {rank: bandwidth}"),
    ({"rank_bandwidth": {-1: "1gbit"}}, ValueError, "keys must be ranks"),
    ({"rank_bandwidth": {0: "slow"}}, ValueError, "rank_bandwidth[0]"),
])
def test_bad_settings_say_what_to_write(kwargs, error, words):
    with pytest.raises(error, match=None) as info:
        Network(**kwargs)
    assert words in str(info.value)


def test_a_rank_link_beyond_the_world_is_refused():
    with pytest.raises(ValueError, match=r"names ranks \[3\], but world_size is 2"):
        check_network(Network(rank_bandwidth={3: "1gbit"}), world_size=2)


def test_a_bandwidth_alone_is_a_network_and_none_is_loopback():
    assert check_network(None, 2) is None
    assert check_network("1gbit", 2) == Network(bandwidth="1gbit")
    with pytest.raises(TypeError, match="network must be ddp_lab.Network"):
        check_network({"bandwidth": "1gbit"}, 2)


def test_equal_networks_hash_alike_and_links_default_to_the_bandwidth():
    net = Network("1gbit", rank_bandwidth={1: "200mbit"})
    assert hash(net) == hash(Network(1e9, rank_bandwidth={1: 2e8}))
    assert [net.link_bits(r) for r in range(3)] == [1e9, 2e8, 1e9]


@pytest.mark.parametrize("call, words", [
    (lambda: ddp_lab.run(workers.rank_and_env, 2, network="fast"), "not understood"),
    (lambda: ddp_lab.run(workers.rank_and_env, 300, network="1gbit"), "at most 253"),
    (lambda: ddp_lab.run(workers.rank_and_env, 2, backend="nccl", network="1gbit"),
     "backend='gloo'"),
    (lambda: ddp_lab.run_script(__file__, 2, launcher="torchrun", network="1gbit"),
     "launcher='ddp_lab' only"),
])
def test_run_refuses_before_any_process_starts(call, words):
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    with pytest.raises((ValueError, TypeError)) as info:
        call()
    assert words in str(info.value)
    assert {p.pid for p in psutil.Process().children(recursive=True)} <= before
