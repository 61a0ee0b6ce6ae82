"""BackwardTrace (the capstone's instrument) on real ranks: it sees an all-reduce however it
is called, and tells one issued from a gradient hook (in backward) from one issued after."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from torch import nn

import ddp_lab
from ddp_lab import scratch

pytestmark = [pytest.mark.timeout(180), pytest.mark.usefixtures("warm_fork_server")]


def _traced() -> dict:
    from torch.distributed import all_reduce

    from ddp_lab.course.ch07_inside_ddp.backward_trace import BackwardTrace
    model = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 2))
    ddp = scratch.DDP(model, bucket_mb=None)
    with BackwardTrace() as trace:
        ddp(torch.randn(3, 4)).sum().backward()
        ddp.sync_gradients()
        all_reduce(torch.ones(5))
        dist.distributed_c10d._get_default_group().allreduce([torch.ones(6)]).wait()
    return {"issued": [(*i.summary(), i.in_backward) for i in trace.issued],
            "times": [i.at for i in trace.issued]}


def test_hooks_issue_in_backward_and_every_form_is_seen():
    for found in ddp_lab.run(_traced, world_size=2, echo=False).values:
        issued = found["issued"]
        gradients = [(numel, True) for numel in (2, 16, 8, 32)]  # last layer first
        assert [(numel, back) for _, numel, _, back in issued[:4]] == gradients
        assert [call[:3] for call in issued[4:]] == [("all_reduce", 4, "int64"),
                                                     ("all_reduce", 5, "float32"),
                                                     ("all_reduce", 6, "float32")]
        assert not any(back for *_, back in issued[4:])
        assert found["times"] == sorted(found["times"])
