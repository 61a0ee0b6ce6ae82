"""Notebook 11's DTensor basics on real ranks: distribute_tensor keeps rank 0's data,
from_local trusts each rank unless run_check, Shard(1) @ Shard(0) is Partial and its
redistribute to Replicate is one all-reduce (the same as one process), uneven shards split
like torch.chunk, and CommDebugMode agrees with the course's CollectiveTrace."""

from __future__ import annotations

import pytest
import torch
from matplotlib.figure import Figure

import ddp_lab
from ddp_lab.course.ch11_meshes import dtensor_basics, plots

pytestmark = pytest.mark.timeout(240)


@pytest.mark.parametrize("world", [2, 4])
def test_dtensor_basics_against_one_process(world):
    values = ddp_lab.run(dtensor_basics.dtensor_basics, world_size=world, echo=False).values
    a, b = dtensor_basics.operands()
    step = 8 // world
    for rank, v in enumerate(values):
        making = v["making"]
        assert torch.equal(making["distribute"]["full"], torch.arange(8.0).reshape(4, 2))
        assert making["distribute"]["counts"] == {"scatter_": 1}
        assert making["unchecked_replica"].tolist() == [rank, rank]
        assert making["checked_replica"].tolist() == [0, 0]
        assert making["check_counts"] == {"allgather_": 2, "broadcast_": 1}
        mm = v["matmul"]
        assert mm["placements"] == ["Partial(sum)"] and mm["matmul_counts"] == {}
        assert mm["redistribute_counts"] == mm["traced_counts"] == {"all_reduce": 1}
        cols = slice(step * rank, step * (rank + 1))
        torch.testing.assert_close(mm["partial_local"], a[:, cols] @ b[cols])
        torch.testing.assert_close(mm["replicated"], a @ b)
        uneven = v["uneven"]
        assert uneven["told_shape"] == (dtensor_basics.UNEVEN_ROWS, 3)
        assert torch.equal(uneven["full"], uneven["told_full"])
    rows = [v["uneven"]["local_rows"] for v in values]
    expected = [len(chunk) for chunk in torch.arange(dtensor_basics.UNEVEN_ROWS).chunk(world)]
    assert rows == expected + [0] * (world - len(expected))      # torch.chunk, then empty
    assert isinstance(plots.partial_matmul_picture(values), Figure)
