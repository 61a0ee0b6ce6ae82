"""Notebook 10's FSDP2 switches (section 8), run for real on gloo: mixed precision, CPU
offload, HSDP, accumulation without communication, clipping, meta-device init, resuming
from a DCP checkpoint with the optimizer state, FSDP1's flat parameter. Results are compared
with one process; collectives are counted, never timed."""

from __future__ import annotations

import os

import pytest
import torch
from matplotlib.figure import Figure
from torch.distributed.tensor import Replicate, Shard

import ddp_lab
from ddp_lab.course.ch10_sharding import (checkpoint, equivalence, fsdp2_features, fsdp2_lifecycle,
                                          plots)

pytestmark = pytest.mark.timeout(240)

CONFIG = fsdp2_features.FEATURES_MODEL


def run(fn, world_size, *args, **kwargs):
    return ddp_lab.run(fn, world_size=world_size, args=args, kwargs=kwargs, echo=False).values


@pytest.fixture(scope="module")
def features():
    """Every demo on 4 ranks (HSDP as 2 replicas of 2 shards), one launch for the module."""
    return run(fsdp2_features.every_feature, 4)


@pytest.fixture(scope="module")
def reference():
    return equivalence.reference(CONFIG)


def test_mixed_precision_gathers_bf16_and_reduces_fp32(features):
    for r in features:
        m = r["mixed precision"]
        assert set(m["in_forward"]) == {("Parameter", torch.bfloat16)}
        assert set(m["after_backward"].values()) == {("DTensor", torch.float32, "DTensor", torch.float32)}
        assert 2 * m["bytes"]["_allgather_base_"] == m["plain_bytes"]["_allgather_base_"]
        assert m["bytes"]["_reduce_scatter_base_"] == m["plain_bytes"]["_reduce_scatter_base_"]


def test_cpu_offload_without_pinning_trains_like_one_process(features, reference):
    for r in features:
        o = r["cpu offload"]
        assert "accelerator" in o["pin_memory=True"]       # pinning needs a GPU (this machine has none)
        assert o["devices"] == {"parameters": {"cpu"}, "gradients": {"cpu"},
                                "optimizer state": {"cpu"}}
        assert equivalence.largest_difference(o, reference) < 1e-5


def test_hsdp_replicates_shards_and_equals_one_process(features, reference):
    for r in features:
        h = r["hsdp"]
        assert h["mesh"] == (2, 2)
        assert all(p == (Replicate(), Shard(0)) for p in h["placements"].values())
        assert h["calls"] == [("_allgather_base_", 2), ("_reduce_scatter_base_", 2), ("allreduce_", 2)]
        assert equivalence.largest_difference(h, reference) < 1e-5


def test_accumulation_without_sync_reduces_once_with_the_same_gradient(features):
    one = fsdp2_features.one_process_grads(CONFIG)
    for r in features:
        every, last = r["accumulation"]["sync every micro-batch"], r["accumulation"]["sync the last only"]
        assert every["counts"] == {"_allgather_base_": 18, "_reduce_scatter_base_": 9}
        assert last["counts"] == {"_allgather_base_": 18, "_reduce_scatter_base_": 3}
        torch.testing.assert_close(last["grads"], every["grads"])
        torch.testing.assert_close(last["grads"], one["grads"])
    assert isinstance(plots.fsdp2_switches_figure(features[0]), Figure)


def test_clipping_sharded_gradients_equals_one_process(features):
    one = fsdp2_features.one_process_grads(CONFIG, max_norm=0.1)
    for r in features:
        c = r["clipping"]
        assert c["counts"] == {"all_reduce": 1} and c["norm"] > 0.1
        assert c["norm_placements"] == (Replicate(),)
        assert c["norm"] == pytest.approx(one["norm"], rel=1e-6)
        torch.testing.assert_close(c["grads"], one["grads"])


def test_meta_init_allocates_shards_only_and_trains(features):
    meta = [r["meta init"] for r in features]
    full = meta[0]["full_numel"]
    for name, numel in full.items():
        assert sum(m["local_numel"][name] for m in meta) == numel
    expected = fsdp2_lifecycle.reference_from(meta[0]["initial"], CONFIG)
    for m in meta:
        assert m["on_meta"] and m["same seed: shards repeat"]
        assert all(m["local_numel"][k] < full[k] for k in full)
        assert equivalence.largest_difference(m, expected) < 1e-5
    shards = meta[0]["initial"]["2.weight"].chunk(4)
    assert not torch.equal(shards[0][:7], shards[3][:7])


def test_resuming_with_optimizer_state_is_exact_and_cleans_up(features):
    for r in features:
        res = r["resume"]
        assert checkpoint.same_tensors(res["resumed"]["model and optimizer"], res["uninterrupted"])
        assert not checkpoint.same_tensors(res["resumed"]["model only"], res["uninterrupted"])
        assert res["optimizer keys"] == ["exp_avg", "exp_avg_sq", "step"]
        assert res["files"] == [".metadata"] + [f"__{i}_0.distcp" for i in range(4)]
        assert not res["left behind"] and not os.path.exists(res["folder"])
    assert set(features[0]["resume"]["exported"].values()) == {"Tensor"}
    assert all(r["resume"]["exported"] == {} for r in features[1:])


def test_fsdp1_keeps_one_flat_parameter_fsdp2_one_dtensor_each(features):
    total = sum(features[0]["meta init"]["full_numel"].values())
    for r in features:
        (name, _, shape), = r["fsdp1 vs fsdp2"]["FSDP1"]
        assert name.endswith("_flat_param") and shape == (-(-total // 4),)
        assert {kind for _, kind, _ in r["fsdp1 vs fsdp2"]["FSDP2"]} == {"DTensor"}


def lifecycle_on_this_world(config):
    return {"meta init": fsdp2_lifecycle.meta_init(config),
            "resume": fsdp2_lifecycle.resume_from_checkpoint(config),
            "clipping": fsdp2_features.clipping(config)}


def test_init_resume_and_clipping_on_three_ranks():
    """Odd world sizes too: uneven shards, the same results."""
    results = run(lifecycle_on_this_world, 3, CONFIG)
    expected = fsdp2_lifecycle.reference_from(results[0]["meta init"]["initial"], CONFIG)
    one = fsdp2_features.one_process_grads(CONFIG, max_norm=0.1)
    for r in results:
        assert equivalence.largest_difference(r["meta init"], expected) < 1e-5
        assert checkpoint.same_tensors(r["resume"]["resumed"]["model and optimizer"],
                                       r["resume"]["uninterrupted"])
        assert not r["resume"]["left behind"]
        assert r["clipping"]["norm"] == pytest.approx(one["norm"], rel=1e-6)
