"""Notebook 03b's single-tensor collectives, futures and functional collectives on real
gloo ranks: the same values as the list forms and as a sum computed here, the c10d op each
one reaches, the deprecation of all_gather_into_tensor, and an AsyncCollectiveTensor that
leaves its input alone."""

from __future__ import annotations

import pytest
import torch

import ddp_lab
from ddp_lab.course.ch03_collectives import tensor_forms

pytestmark = pytest.mark.timeout(240)


@pytest.mark.parametrize("world", [2, 4])
def test_tensor_forms_match_the_list_forms_and_a_local_sum(world):
    values = ddp_lab.run(tensor_forms.tour, world_size=world, echo=False).values
    gathered = [torch.arange(1.0, 4) + 10 * peer for peer in range(world)]
    total = sum(torch.arange(1.0, 2 * world + 1) + 10 * peer for peer in range(world))
    for rank, v in enumerate(values):
        assert all(map(torch.equal, v["gather"]["list"], gathered))
        assert torch.equal(v["gather"]["flat"], torch.cat(gathered))
        assert v["gather"]["ops"] == ["allgather_", "_allgather_base_"]
        assert torch.equal(v["reduce_scatter"]["tensor"], total.chunk(world)[rank])
        assert torch.equal(v["reduce_scatter"]["list"], v["reduce_scatter"]["tensor"])
        assert v["reduce_scatter"]["ops"] == ["reduce_scatter_", "_reduce_scatter_base_"]
        assert torch.equal(v["old_name"]["out"], v["gather"]["flat"])
        assert [w for w, _ in v["old_name"]["warnings"]] == ["FutureWarning"]
        assert v["p2p_future"] == "Work::getFuture not implemented."  # gloo: no p2p futures
        assert torch.equal(v["future"]["mean"], sum(gathered) / world)
        functional = v["functional"]
        assert functional["type"] == "AsyncCollectiveTensor" and functional["input_unchanged"]
        assert torch.equal(functional["sum"], sum(gathered))
        assert functional["ops"] == ["allreduce_", "all_reduce", "all_reduce"]


def test_three_all_reduces_in_the_coalescing_manager_are_one_op():
    for rank in ddp_lab.run(tensor_forms.coalesced, 3, echo=False).values:
        assert rank["ops"] == ["allreduce_coalesced_"]
        assert rank["sums"] == [[6.0] * 3, [6.0] * 5, [6.0] * 2]
