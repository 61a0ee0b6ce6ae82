"""backend="auto": gloo and NCCL in one default group where every rank has a GPU, else gloo.

The rule is a pure function of the GPU count and the world size (tested here for every
case); what torch makes of a device:backend string is tested in real ranks with the pairs a
CPU build has (gloo for both devices); tests/gpu/ runs "cpu:gloo,cuda:nccl" itself.
"""

from __future__ import annotations

import psutil
import pytest
import torch
import torch.distributed as dist

import ddp_lab
from ddp_lab.launch import backends, checks

pytestmark = pytest.mark.timeout(120)


@pytest.mark.parametrize("world_size, gpus, nccl, expected", [
    (1, 0, True, "gloo"),                   # no GPU
    (4, 0, False, "gloo"),                  # a CPU build of torch
    (1, 1, True, "cpu:gloo,cuda:nccl"),     # one rank, one GPU
    (2, 1, True, "gloo"),                   # two ranks would share the GPU: NCCL refuses
    (4, 4, True, "cpu:gloo,cuda:nccl"),
    (4, 8, True, "cpu:gloo,cuda:nccl"),
    (8, 4, True, "gloo"),
    (4, 4, False, "gloo"),                  # GPUs but torch without NCCL
])
def test_auto_is_gloo_and_nccl_with_a_gpu_per_rank_else_gloo(world_size, gpus, nccl, expected):
    assert backends.resolve_backend("auto", world_size, gpus, nccl) == expected


@pytest.mark.parametrize("backend", ["gloo", "nccl", "cpu:gloo", "cpu:gloo,cuda:nccl"])
def test_other_backends_are_used_as_given(backend):
    assert backends.resolve_backend(backend, 2, 8, True) == backend


@pytest.mark.parametrize("backend, cuda, nccl", [
    ("gloo", "gloo", False), ("nccl", "nccl", True), ("cpu:gloo,cuda:nccl", "nccl", True),
    ("cuda:nccl,cpu:gloo", "nccl", True), ("cpu:gloo", None, False),
    ("cpu:gloo,cuda:gloo", "gloo", False), ("mpi", "mpi", False),
])
def test_which_backend_moves_cuda_tensors(backend, cuda, nccl):
    assert backends.cuda_backend(backend) == cuda
    assert backends.uses_nccl(backend) is nccl


@pytest.mark.parametrize("backend", ["gloo", "cpu:gloo,cuda:nccl", "cpu:gloo", "cuda:nccl",
                                     "cpu:gloo,cuda:gloo"])
def test_torch_reads_device_backend_strings_as_we_do(backend):
    """torch's own parser (BackendConfig, what init_process_group uses) gives the same map."""
    from torch.distributed.distributed_c10d import BackendConfig
    theirs = {device: str(name) for device, name in BackendConfig(backend).get_device_backend_map().items()}
    assert theirs == backends.device_backends(backend)


@pytest.mark.parametrize("backend", ["auto", "gloo", "nccl", "cpu:gloo", "cuda:nccl",
                                     "cpu:gloo,cuda:nccl", "cuda:nccl,cpu:gloo",
                                     "cpu:gloo,cuda:gloo"])
def test_accepted_backends(backend):
    assert checks.check_backend(backend) == backend


@pytest.mark.parametrize("backend", ["mpi", "NCCL", "Gloo", " gloo", "cpu:nccl", "cpu:gloo,",
                                     "cpu:gloo,cpu:gloo", "cpu:gloo:cuda", "gpu:nccl", "",
                                     None, 1, "cpu:mpi", "cpu:gloo, cuda:nccl"])
def test_refused_backends_name_the_choices(backend):
    with pytest.raises(ValueError, match="unknown backend.*'auto'.*cpu:gloo,cuda:nccl"):
        checks.check_backend(backend)


@pytest.mark.parametrize("backend", ["nccl", "cpu:gloo,cuda:nccl", "cuda:nccl"])
def test_nccl_for_cuda_tensors_needs_a_gpu_per_rank(backend):
    checks.check_gpus(backend, 2, 2)
    with pytest.raises(ValueError, match=f"backend='{backend}' needs one GPU per rank: "
                                         r"world_size=2 but 1 GPU\(s\)"):
        checks.check_gpus(backend, 2, 1)
    checks.check_gpus("gloo", 64, 0)
    checks.check_gpus("cpu:gloo,cuda:gloo", 64, 0)


def test_two_backends_without_the_gpus_are_refused_before_any_process_starts():
    if torch.cuda.is_available() and torch.cuda.device_count() >= 64:
        pytest.skip("this machine really has 64 GPUs")
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    with pytest.raises(ValueError, match="one GPU per rank.*backend='gloo'"):
        ddp_lab.run(_group_facts, world_size=64, backend="cpu:gloo,cuda:nccl")
    with pytest.raises(ValueError, match="network= shapes gloo's TCP"):
        ddp_lab.run(_group_facts, world_size=2, backend="cpu:gloo,cuda:nccl", network="1gbit")
    assert {p.pid for p in psutil.Process().children(recursive=True)} <= before


def _group_facts() -> dict:
    """What torch says about the default group, and that every kind of collective works."""
    from torch.distributed.distributed_c10d import _get_object_coll_device

    from ddp_lab.course.training import rank_device
    t = torch.ones(2) * (dist.get_rank() + 1)
    dist.all_reduce(t)
    objects = [None] * dist.get_world_size()
    dist.all_gather_object(objects, {"rank": dist.get_rank()})
    dist.barrier()
    sub = dist.new_group()  # inherits the default group's backend string
    return {"backend": dist.get_backend(), "config": dist.get_backend_config(),
            "sub": dist.get_backend(sub), "sum": t.tolist(), "objects": objects,
            "object_device": _get_object_coll_device(), "device": str(rank_device())}


@pytest.mark.parametrize("backend", ["cpu:gloo", "cpu:gloo,cuda:gloo"])
def test_a_device_backend_string_reaches_the_ranks_as_written(backend):
    """dist.get_backend() returns the string as given (not a backend name), new groups inherit
    it, object collectives and barrier run on the CPU's backend, and the course's device
    helper stays on the CPU: nothing in the string sends CUDA tensors through NCCL."""
    res = ddp_lab.run(_group_facts, world_size=2, backend=backend, echo=False)
    assert res.backend == backend
    for facts in res.values:
        assert facts["backend"] == facts["sub"] == backend
        assert facts["config"] == str(torch.distributed.distributed_c10d.BackendConfig(backend))
        assert facts["sum"] == [3.0, 3.0] and facts["objects"] == [{"rank": 0}, {"rank": 1}]
        assert facts["object_device"] == "cpu" and facts["device"] == "cpu"


def test_auto_without_gpus_is_plain_gloo():
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU: tests/gpu covers auto there")
    res = ddp_lab.run(_group_facts, world_size=2, echo=False)
    assert res.backend == "gloo" and res[0]["backend"] == "gloo" and res[1]["device"] == "cpu"
