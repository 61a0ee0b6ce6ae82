"""Notebook 13's chapter code on real ranks: expert parallelism inside data parallelism (a
(dp, ep) mesh) against one process with every expert and the mean of every rank's loss; the
scale each gradient needs; the dropless control run keeps every assignment."""

from __future__ import annotations

import pytest
import torch

import ddp_lab
from ddp_lab.course.ch13_experts import equivalence, routing

pytestmark = pytest.mark.timeout(180)


def test_expert_and_data_parallel_equals_one_process():
    """4 ranks as dp 2 x ep 2: router averaged over every rank, each expert summed over its
    dp group and divided by every rank; DDP over the dp group alone (divide by dp) leaves the
    experts ep times too large."""
    got = ddp_lab.run(equivalence.both_ep_dp, world_size=4, args=(equivalence.MoEConfig(), 2),
                      echo=False).values
    one = got[0]["one process"]
    for rank, r in enumerate(got):
        assert r["ep_ranks"] == [rank // 2 * 2, rank // 2 * 2 + 1]
        assert r["dp_ranks"] == [rank % 2, rank % 2 + 2]
        assert r["experts"] == list(range(4 * (rank % 2), 4 * (rank % 2) + 4))
        torch.testing.assert_close(r["out"], one["outs"][rank])
        torch.testing.assert_close(r["router_grad"], one["router_grad"])
        for e in r["experts"]:
            torch.testing.assert_close(r["expert_grads"][e], one["expert_grads"][e])
            torch.testing.assert_close(r["expert_grads_dp_mean"][e], [2 * g for g in one["expert_grads"][e]])



def test_dropless_run_keeps_every_assignment():
    config = routing.TrainConfig(steps=3)
    got = ddp_lab.run(routing.with_and_without, world_size=2, args=(config, 0.5), echo=False).values
    for r in got:
        assert [h["dropped"] for h in r["dropless"]["history"]] == [0, 0, 0]
        assert sum(h["dropped"] for h in r["without"]["history"]) > 0
        for run in ("without", "with"):   # the capacity's drops are per expert, over this rank's own tokens
            for h in r[run]["history"]:
                capacity = -(-int(config.capacity_factor * config.tokens * config.top_k) // config.n_experts)
                assert h["dropped"] == sum(max(0, n - capacity) for n in h["requested"])
