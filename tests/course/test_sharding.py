"""Notebook 10's demos: the collective trace's arithmetic, memory per rank, bytes per step,
FSDP2's reshard_after_forward, DCP resharding, and the figures. Multi-rank results are
compared with one process or with the ZeRO accounting; no timing is asserted."""

from __future__ import annotations

import tempfile

import pytest
import torch
from matplotlib.figure import Figure

import ddp_lab
from ddp_lab.course.ch10_sharding import (checkpoint, equivalence, memory, plots, slow_link,
                                          traffic)
from ddp_lab.course.collective_trace import CollectiveCall

pytestmark = pytest.mark.timeout(240)


def run(fn, world_size, *args, **kwargs):
    return ddp_lab.run(fn, world_size=world_size, args=args, kwargs=kwargs, echo=False).values


def test_ring_traffic_per_collective():
    assert CollectiveCall("allreduce_", 400, 4).bytes_per_rank == 600       # 2 (n-1)/n
    assert CollectiveCall("all_reduce", 400, 2).bytes_per_rank == 400
    assert CollectiveCall("_allgather_base_", 400, 4).bytes_per_rank == 300  # (n-1)/n
    assert CollectiveCall("reduce_scatter_tensor", 400, 4).bytes_per_rank == 300
    assert CollectiveCall("broadcast_", 400, 1).bytes_per_rank == 0


def test_zero_accounting():
    assert memory.expected_bytes("DDP", 100, 4) == {"parameters": 100, "gradients": 100,
                                                    "optimizer state": 200}
    assert memory.expected_bytes("ZeRO-2", 100, 4) == {"parameters": 100, "gradients": 25,
                                                       "optimizer state": 50}
    assert sum(memory.expected_bytes("ZeRO-3", 100, 4).values()) == 100


SMALL = equivalence.TrainConfig(inputs=32, width=32, outputs=32, hidden_layers=2, steps=1)


def test_memory_per_rank_shards_what_each_stage_says():
    runs = {n: run(memory.memory_per_rank, n, config=SMALL) for n in (1, 2)}
    ddp = runs[1][0]["bytes"]["DDP"]
    for n, per_rank in runs.items():
        for r in per_rank:
            got = r["bytes"]
            assert got["DDP"] == ddp and got["ZeRO-1 scratch"]["parameters"] == ddp["parameters"]
            for sharded in ("ZeRO-3 scratch", "FSDP2 fully_shard"):
                for component in memory.COMPONENTS:
                    assert got[sharded][component] <= ddp[component] / n * 1.01 + 64
        assert sum(r["bytes"]["ZeRO-1 scratch"]["optimizer state"] for r in per_rank) == ddp["optimizer state"]
    assert isinstance(plots.memory_figure([per_rank[0] for per_rank in runs.values()]), Figure)


def test_bytes_per_step_match_the_ring_accounting():
    moved = run(traffic.traffic_per_step, 2)[0]
    size, v = moved["parameter_bytes"], moved["variants"]
    assert v["DDP"]["counts"] == {"allreduce_": 1} and v["DDP"]["bytes_per_rank"] == size
    assert v["ZeRO-1 scratch"]["bytes_per_rank"] == 1.5 * size
    assert v["ZeRO-1 scratch"]["counts"] == v["ZeroRedundancyOptimizer"]["counts"]
    assert v["FSDP2 fully_shard"]["bytes_per_rank"] == 1.5 * size
    # scratch ZeRO-3: one all-gather per parameter in forward, one per weight that backward
    # saved (not the first layer's: no gradient flows into the input), one reduce-scatter each
    assert v["ZeRO-3 scratch"]["counts"] == {"_allgather_base_": 8, "_reduce_scatter_base_": 6}
    assert isinstance(plots.traffic_figure(moved), Figure)


def test_reshard_after_forward_trades_memory_for_all_gathers():
    trade = run(traffic.reshard_trade_off, 2, steps=1)[0]
    assert trade[True]["counts"]["_allgather_base_"] == 2 * trade[False]["counts"]["_allgather_base_"]
    assert trade[True]["kept_after_forward"] == 0
    assert trade[False]["kept_after_forward"] == traffic.parameter_bytes(traffic.TRAFFIC_MODEL)


def test_a_checkpoint_saved_on_two_ranks_loads_on_three_and_one():
    with tempfile.TemporaryDirectory() as folder:
        saved = run(checkpoint.save_sharded, 2, folder)
        loaded = [run(checkpoint.load_resharded, m, folder, which) for m, which in ((3, "sync"), (1, "async"))]
    assert saved[0]["files"] == [".metadata", "__0_0.distcp", "__1_0.distcp"]
    assert checkpoint.same_tensors(saved[0]["full"], saved[1]["full"])
    for per_rank in loaded:
        for r in per_rank:
            assert checkpoint.same_tensors(r["full"], saved[0]["full"])
    assert [r["local_shapes"]["2.weight"][0] for r in loaded[0]] == [86, 86, 84]
    assert isinstance(plots.reshard_picture(saved, loaded), Figure)


def test_torch_variants_equal_one_process_on_three_ranks():
    config = equivalence.TrainConfig(steps=2)
    reference = equivalence.reference(config)
    names = ("DDP", "ZeroRedundancyOptimizer", "FSDP2 fully_shard")
    for result in run(equivalence.every_variant, 3, config, names):
        for name in names:
            torch.testing.assert_close(result[name]["losses"], reference["losses"], msg=name)
            torch.testing.assert_close(result[name]["params"], reference["params"], msg=name)


def prefetched_training(config):
    return equivalence.train(slow_link.fsdp2_setting("prefetch", config), config)


def test_prefetching_async_all_gathers_trains_like_one_process():
    """Prefetching changes when the all-gathers run, never what the model computes."""
    config = equivalence.TrainConfig(steps=2)
    reference = equivalence.reference(config)
    for result in run(prefetched_training, 2, config):
        torch.testing.assert_close(result["losses"], reference["losses"])
        torch.testing.assert_close(result["params"], reference["params"])


def test_slow_link_all_gathers_what_each_setting_schedules():
    """Loopback and a shaped link: the same collectives and bytes (counted on every rank);
    the times are only drawn, never compared: this machine is shared."""
    small = slow_link.SlowLinkConfig(model=SMALL, warmup=0, iterations=1)
    results = slow_link.compare("1gbit", small)
    assert list(results) == ["loopback", "1gbit"]
    size = traffic.parameter_bytes(SMALL)
    for per_rank in results.values():
        for r in per_rank:
            assert r["parameter_bytes"] == size and set(r["ms"]) == set(slow_link.SETTINGS)
            assert r["all_gathered"] == {"blocking": 2 * size, "prefetch": 2 * size,
                                         "keep weights": size}
            assert r["counts"]["prefetch"] == r["counts"]["blocking"] == {
                "_allgather_base_": 8, "_reduce_scatter_base_": 4}
    assert slow_link.wire_ms(results["1gbit"][0], "1gbit") == 2 * size / 2 * 8 / 1e9 * 1e3
    assert isinstance(plots.slow_link_figure(results, 1.0), Figure)
    assert "keep weights" in slow_link.format_table(results)


def test_bad_slow_link_settings_are_refused_before_any_run():
    with pytest.raises(ValueError, match="prefetch"):
        slow_link.fsdp2_setting("overlap", SMALL)
    with pytest.raises(ValueError, match="iterations"):
        slow_link.SlowLinkConfig(iterations=0)
    with pytest.raises(ValueError, match="bandwidth"):
        slow_link.compare("fast")
