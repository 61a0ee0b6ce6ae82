"""Notebook 02's demos on real ranks, compared with the arithmetic they should produce."""

from __future__ import annotations

import pytest
import torch

import ddp_lab
from ddp_lab.course.ch02_point_to_point import point_to_point as p2p
from ddp_lab.course.ch02_point_to_point.plots import latency_bandwidth

pytestmark = pytest.mark.timeout(120)


def run(fn, world_size, *args, **kwargs):
    return ddp_lab.run(fn, world_size=world_size, args=args, kwargs=kwargs, timeout=30,
                       echo=False).values


@pytest.mark.parametrize("world_size", [1, 2, 3, 4])
def test_nonblocking_send_recv_delivers_rank0_tensor_everywhere(world_size):
    assert run(p2p.nonblocking_send_recv, world_size) == [1.0] * world_size


@pytest.mark.parametrize("world_size", [1, 2, 4])
def test_recv_from_any_hears_every_other_rank_once(world_size):
    arrivals = run(p2p.recv_from_any, world_size)[0]
    assert sorted(arrivals) == [(r, 10.0 * r) for r in range(1, world_size)]


@pytest.mark.parametrize("world_size", [2, 3, 4])
@pytest.mark.parametrize("dtype", [torch.int64, torch.int32, torch.uint8])
def test_ring_token_matches_closed_form(world_size, dtype):
    numel = 7  # not a multiple of any world size here
    values = run(p2p.ring_token, world_size, numel=numel, dtype=dtype)
    start = torch.arange(numel).to(dtype)
    passed_on = [start + r * (r + 1) // 2 for r in range(world_size)]
    home = start + world_size * (world_size - 1) // 2
    torch.testing.assert_close(values[0], home)
    for rank in range(1, world_size):
        torch.testing.assert_close(values[rank], passed_on[rank])


@pytest.mark.parametrize("fix", [p2p.even_odd_exchange, p2p.nonblocking_exchange,
                                 p2p.batched_exchange])
@pytest.mark.parametrize("world_size", [2, 3, 4])
def test_deadlock_fixes_receive_the_left_neighbour(fix, world_size):
    expected = [(rank - 1) % world_size for rank in range(world_size)]
    assert run(fix, world_size, 1000) == expected


@pytest.mark.parametrize("fn", [p2p.send_then_recv, p2p.even_odd_exchange,
                                p2p.nonblocking_exchange, p2p.batched_exchange])
@pytest.mark.parametrize("world_size, nbytes, says", [(2, 0, "nbytes=0"),
                                                      (1, 1000, "2 or more ranks")])
def test_ring_exchanges_refuse_no_bytes_and_one_rank_before_sending(fn, world_size, nbytes,
                                                                     says):
    """0 bytes carry no sender (an IndexError in _sender_of); on 1 rank the isend to itself
    failed inside gloo ("Pair is not connected"), review IP-02-6."""
    with pytest.raises(ddp_lab.WorkerError) as caught:
        run(fn, world_size, nbytes)
    assert "ValueError" in str(caught.value) and says in str(caught.value)


def test_deadlock_fixes_handle_large_messages():
    assert run(p2p.nonblocking_exchange, 3, 4 << 20) == [2, 0, 1]


@pytest.mark.parametrize("world_size, nbytes", [(2, 1), (3, 4 << 20)])
def test_send_then_recv_deadlocks_with_every_rank_in_send(world_size, nbytes):
    with pytest.raises(ddp_lab.WorkerTimeout) as caught:
        ddp_lab.run(p2p.send_then_recv, world_size=world_size, args=(nbytes,), timeout=1.5,
                    echo=False)
    assert caught.value.stuck_ranks == list(range(world_size))
    assert all("dist.send(" in stack and "dist.recv(" not in stack
               for stack in caught.value.stacks.values())


def test_a_socket_buffers_sends_nobody_reads_yet():
    assert p2p.socket_accepts_unread() > 64 * 1024


SMALL_SWEEP = p2p.PingPongConfig(sizes=(1, 16, 256, 4096, 65536), repeats=2)


@pytest.mark.parametrize("world_size", [2, 3])
def test_ping_pong_measures_every_size(world_size):
    result = p2p.measure_ping_pong(SMALL_SWEEP, world_size=world_size)
    assert result.sizes == list(SMALL_SWEEP.sizes)
    assert all(len(result.round_trips[s]) == 2 for s in result.sizes)
    assert all(t > 0 for t in result.latency) and all(b > 0 for b in result.bandwidth)
    assert result.peak_bandwidth == max(result.bandwidth) and result.alpha > 0


def test_bandwidth_figure_has_a_point_per_size():
    result = p2p.measure_ping_pong(SMALL_SWEEP)
    fig = latency_bandwidth(result)
    time_ax, bw_ax = fig.axes
    assert len(bw_ax.lines[0].get_xdata()) == len(SMALL_SWEEP.sizes)
    fastest = [line for line in time_ax.lines if line.get_label().startswith("fastest")]
    assert list(fastest[0].get_xdata()) == list(SMALL_SWEEP.sizes)


def test_ping_pong_arithmetic():
    result = p2p.PingPong({1024: [4e-5], 1: [3e-5, 2e-5], 16: [1e-5], 1 << 20: [2e-3, 1e-3]})
    assert result.sizes == [1, 16, 1024, 1 << 20]
    assert result.latency == [1e-5, 5e-6, 2e-5, 5e-4]
    assert result.bandwidth == pytest.approx([1e5, 16 / 5e-6, 1024 / 2e-5, (1 << 20) / 5e-4])
    assert result.alpha == 5e-6 and result.peak_bandwidth == pytest.approx((1 << 20) / 5e-4)
    assert result.half_bandwidth_size == pytest.approx(5e-6 * (1 << 20) / 5e-4)
    assert "1 MiB" in result.table()


def test_the_shaped_fit_has_three_sizes_past_the_burst_and_finds_a_line():
    from ddp_lab.course.ch02_point_to_point import shaped
    assert [s for s in shaped.SHAPED_CONFIG.sizes if s >= shaped.FIT_FROM] == [1 << 20, 2 << 20,
                                                                            4 << 20]
    line = p2p.PingPong({s: [2 * (1e-4 + s / 25e6)] for s in shaped.SHAPED_CONFIG.sizes})
    fit = shaped.fit_alpha_beta(line)
    assert fit.alpha == pytest.approx(1e-4) and fit.bandwidth == pytest.approx(25e6)
    with pytest.raises(ValueError, match="two sizes"):
        shaped.fit_alpha_beta(p2p.PingPong({1: [1e-4], 1 << 20: [1e-2]}))


@pytest.mark.parametrize("n, text", [(1, "1 B"), (1023, "1023 B"), (4096, "4 KiB"),
                                     (3 << 19, "1.5 MiB"), (64 << 20, "64 MiB")])
def test_format_bytes(n, text):
    assert p2p.format_bytes(n) == text


