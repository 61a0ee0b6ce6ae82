"""On a machine with CUDA: the launcher, backend="auto" and the course's GPU paths, for real.

Skipped where CUDA is absent (every test is marked ``gpu``: ``pytest -m gpu tests/gpu``,
or ``make test-gpu``). Sized for one GPU; more GPUs only widen what "auto" covers.
The measurements (the CNN script's samples/s on GPU and CPU) are printed and recorded as
junit properties (``--junitxml``), not asserted: a small CNN on 8x8 digits may well be
faster on the CPU.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import psutil
import pytest
import torch
import torch.distributed as dist

import ddp_lab
from ddp_lab.launch.backends import GPU_AND_CPU, auto_backend

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
    pytest.mark.timeout(240),
]
TESTS = str(Path(__file__).parents[1])
ROOT = str(Path(__file__).parents[2])


def _gpus() -> int:
    return torch.cuda.device_count()


def _children() -> set[int]:
    return {p.pid for p in psutil.Process().children(recursive=True)}


# -- the launcher from a kernel that has initialized CUDA ---------------------------------------
def test_a_kernel_that_initialized_cuda_runs_ranks(tmp_path):
    """Fork-based launchers break once the kernel has a CUDA context ("Cannot re-initialize
    CUDA in forked subprocess"); ddp_lab's ranks come from its fork server, never the kernel."""
    from kernel_helpers import execute, start_kernel
    manager, client = start_kernel(tmp_path)
    try:
        run = execute(client, f"""
            import sys; sys.path.insert(0, {TESTS!r})
            import torch, ddp_lab
            from ddp_lab.course.ch00_launching import launching
            x = torch.ones(3, device="cuda")
            assert torch.cuda.is_initialized() and x.sum().item() == 3.0
            for n in (2, 4):
                res = ddp_lab.run(launching.all_reduce_ranks, world_size=n, echo=False)
                assert res.values == [[float(sum(range(n)))]] * n, res.values
                print(n, res.backend)
        """, timeout=180)
        assert run.ok, (run.reply, run.error, run.printed)
        for n in (2, 4):
            backend = auto_backend(n, _gpus(), dist.is_nccl_available())
            assert f"{n} {backend}" in run.printed.splitlines(), run.printed
    finally:
        client.stop_channels()
        manager.shutdown_kernel(now=True)


# -- backend="auto" ----------------------------------------------------------------------------
def readme_total(x):
    """The README's first example, as written there (CPU tensors)."""
    t = torch.tensor([x * (dist.get_rank() + 1)])
    dist.all_reduce(t)
    print("sum is", t.item())
    return t.item()


def readme_total_on_gpu(x):
    """The same on this rank's GPU, plus what torch says about the group."""
    from torch.distributed.distributed_c10d import _get_object_coll_device

    from ddp_lab.course.training import rank_device
    t = torch.tensor([x * (dist.get_rank() + 1)], device=rank_device())
    dist.all_reduce(t)
    objects = [None] * dist.get_world_size()
    dist.all_gather_object(objects, dist.get_rank())
    dist.barrier()
    world = dist.group.WORLD
    return {"sum": t.item(), "device": str(t.device), "current": torch.cuda.current_device(),
            "backend": dist.get_backend(), "objects": objects,
            "object_device": _get_object_coll_device(), "name": world.name(),
            "cpu_backend": type(world._get_backend(torch.device("cpu"))).__name__,
            "cuda_backend": type(world._get_backend(torch.device("cuda"))).__name__}


@pytest.mark.parametrize("world_size", sorted({1, _gpus() if torch.cuda.is_available() else 1, 4}))
def test_readme_example_with_cpu_tensors_under_auto(world_size):
    res = ddp_lab.run(readme_total, world_size=world_size, args=(1.0,), echo=False)
    total = float(sum(range(1, world_size + 1)))
    assert res.values == [total] * world_size
    assert res.backend == auto_backend(world_size, _gpus(), dist.is_nccl_available())
    if world_size <= _gpus():
        assert res.backend == GPU_AND_CPU  # CPU tensors in a group that has NCCL: gloo's


def test_readme_example_with_cuda_tensors_on_one_rank():
    res = ddp_lab.run(readme_total_on_gpu, world_size=1, args=(1.0,), echo=False)
    facts = res[0]
    assert res.backend == GPU_AND_CPU and facts["backend"] == GPU_AND_CPU
    assert facts["sum"] == 1.0 and facts["device"] == "cuda:0" and facts["current"] == 0
    assert facts["objects"] == [0] and facts["object_device"] == "cpu"
    assert facts["name"] == "nccl"  # the group's default backend (what DDP logs)
    assert (facts["cpu_backend"], facts["cuda_backend"]) == ("ProcessGroupGloo",
                                                             "ProcessGroupNCCL")


def test_nccl_with_more_ranks_than_gpus_is_refused_before_any_process_starts():
    before = _children()
    with pytest.raises(ValueError, match="backend='nccl' needs one GPU per rank.*'gloo'"):
        ddp_lab.run(readme_total, world_size=_gpus() + 1, args=(1.0,), backend="nccl")
    assert _children() <= before


# -- gloo on CUDA tensors, NCCL alone ----------------------------------------------------------
def gloo_collectives_on_cuda(dev: str = "cuda:0") -> dict:
    """The collectives notebook 01 says gloo runs on CUDA tensors, on cuda:0 shared by every
    rank: each one's result, or its error (gloo refuses an unsupported one on every rank
    alike, before any traffic, so an error cannot leave a peer waiting)."""
    rank, world = dist.get_rank(), dist.get_world_size()
    mine = torch.arange(2.0, device=dev) + 10 * rank

    def broadcast():
        t = mine.clone()
        dist.broadcast(t, src=0)
        return t.tolist()

    def all_reduce():
        t = mine.clone()
        dist.all_reduce(t)
        return t.tolist()

    def reduce():
        t = mine.clone()
        dist.reduce(t, dst=0)
        return t.tolist() if rank == 0 else None

    def all_gather():
        parts = [torch.empty(2, device=dev) for _ in range(world)]
        dist.all_gather(parts, mine)
        return [p.tolist() for p in parts]

    def gather():
        parts = [torch.empty(2, device=dev) for _ in range(world)] if rank == 0 else None
        dist.gather(mine, parts, dst=0)
        return [p.tolist() for p in parts] if parts else None

    def scatter():
        t = torch.empty(2, device=dev)
        parts = [torch.full((2,), float(r), device=dev) for r in range(world)]
        dist.scatter(t, parts if rank == 0 else None, src=0)
        return t.tolist()

    def all_to_all():
        outs = [torch.empty(1, device=dev) for _ in range(world)]
        dist.all_to_all(outs, [torch.tensor([10.0 * rank + r], device=dev)
                               for r in range(world)])
        return [o.item() for o in outs]

    def all_to_all_single():
        out = torch.empty(world, device=dev)
        dist.all_to_all_single(out, torch.arange(float(world), device=dev) + 10 * rank)
        return out.tolist()

    def reduce_scatter():
        t = torch.empty(2, device=dev)
        dist.reduce_scatter(t, [mine.clone() for _ in range(world)])
        return t.tolist()

    out = {}
    for op in (broadcast, all_reduce, reduce, all_gather, gather, scatter, all_to_all,
               all_to_all_single, reduce_scatter):
        try:
            out[op.__name__] = op()
        except RuntimeError as exc:
            out[op.__name__] = "error: " + str(exc).splitlines()[0]
    return out


def test_gloo_collectives_on_cuda_tensors_across_two_ranks_sharing_the_gpu():
    res = ddp_lab.run(gloo_collectives_on_cuda, world_size=2, backend="gloo", echo=False)
    r0, r1 = res.values
    for op in ("all_to_all", "all_to_all_single", "reduce_scatter"):  # reported, not asserted
        print(f"gloo {op} on CUDA tensors: rank 0 {r0[op]}, rank 1 {r1[op]}")
    assert r0["broadcast"] == r1["broadcast"] == [0.0, 1.0]
    assert r0["all_reduce"] == r1["all_reduce"] == [10.0, 12.0]
    assert r0["reduce"] == [10.0, 12.0]
    assert r0["all_gather"] == r1["all_gather"] == [[0.0, 1.0], [10.0, 11.0]]
    assert r0["gather"] == [[0.0, 1.0], [10.0, 11.0]]
    assert (r0["scatter"], r1["scatter"]) == ([0.0, 0.0], [1.0, 1.0])


def nccl_alone() -> dict:
    """Plain "nccl": CUDA tensors work, CPU tensors are refused (why "auto" adds gloo)."""
    t = torch.ones(2, device="cuda")
    dist.all_reduce(t)
    try:
        dist.all_reduce(torch.ones(2))
        cpu = "ok"
    except RuntimeError as exc:
        cpu = str(exc).splitlines()[0]
    return {"sum": t.tolist(), "backend": dist.get_backend(), "cpu": cpu,
            "current": torch.cuda.current_device()}


def test_nccl_on_one_rank_moves_cuda_tensors_and_refuses_cpu_ones():
    res = ddp_lab.run(nccl_alone, world_size=1, backend="nccl", echo=False)
    assert res[0]["sum"] == [1.0, 1.0] and res[0]["backend"] == "nccl"
    assert res[0]["current"] == 0
    assert res[0]["cpu"] != "ok", "NCCL took a CPU tensor: 'auto' would not need gloo"
    print("NCCL on a CPU tensor:", res[0]["cpu"])


# -- DDP and the CNN script on the GPU -----------------------------------------------------------
def ddp_step_on_gpu() -> dict:
    """DDP(device_ids=[0]) on one rank: the same step as the bare module on the same GPU."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    from ddp_lab.course.models import ToyModel
    from ddp_lab.course.training import rank_device
    device = rank_device()
    torch.manual_seed(0)
    model, twin = ToyModel().to(device), ToyModel().to(device)
    twin.load_state_dict(model.state_dict())
    ddp = DDP(model, device_ids=[device.index])
    x, y = torch.randn(20, 10, device=device), torch.randn(20, 5, device=device)
    for net in (ddp, twin):
        torch.nn.functional.mse_loss(net(x), y).backward()
    grads = [(a.grad - b.grad).abs().max().item()
             for a, b in zip(model.parameters(), twin.parameters())]
    return {"device": str(device), "param_device": str(next(model.parameters()).device),
            "max_grad_diff": max(grads)}


def test_ddp_with_device_ids_on_one_rank():
    res = ddp_lab.run(ddp_step_on_gpu, world_size=1, echo=False)
    assert res[0]["device"] == res[0]["param_device"] == "cuda:0"
    assert res[0]["max_grad_diff"] <= 1e-6


def _train_cnn_under_torchrun(env_extra: dict, tmp_path: Path) -> tuple[float, str]:
    env = {**os.environ, **env_extra,
           "PYTHONPATH": os.pathsep.join(filter(None, [ROOT, os.environ.get("PYTHONPATH")]))}
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone",
               "--nproc-per-node=1", f"--log-dir={tmp_path / 'logs'}",  # else /tmp/torchelastic_*
               "-m", "ddp_lab.scripts.train_cnn", "--epochs", "2", "--no-progress"]
    done = subprocess.run(command, env=env, cwd=tmp_path, capture_output=True, text=True,
                          timeout=180)
    assert done.returncode == 0, done.stdout + done.stderr
    rate = re.search(r"Throughput: (\d+) samples/s", done.stdout)
    device = re.search(r"local device: (\S+)\)", done.stdout)
    assert rate and device and "Test accuracy:" in done.stdout, done.stdout
    return float(rate.group(1)), device.group(1)


def test_cnn_script_under_torchrun_on_the_gpu_and_on_the_cpu(tmp_path, record_property):
    gpu_rate, gpu_device = _train_cnn_under_torchrun({}, tmp_path)
    cpu_rate, cpu_device = _train_cnn_under_torchrun({"CUDA_VISIBLE_DEVICES": ""}, tmp_path)
    assert (gpu_device, cpu_device) == ("cuda:0", "cpu")
    for name, value in (("cnn_samples_per_s_gpu", gpu_rate), ("cnn_samples_per_s_cpu", cpu_rate)):
        record_property(name, value)
    print(f"train_cnn, torchrun --nproc-per-node=1, 2 epochs: GPU {gpu_rate:.0f} samples/s, "
          f"CPU {cpu_rate:.0f} samples/s (GPU/CPU {gpu_rate / cpu_rate:.2f})")


def test_live_ranks_under_auto_move_cpu_and_cuda_tensors():
    n = min(_gpus(), 2)
    with ddp_lab.Ranks(world_size=n, echo=False) as ranks:
        ranks.exec("c = torch.ones(2); dist.all_reduce(c)\n"
                   "g = torch.ones(2, device='cuda'); dist.all_reduce(g)\n"
                   "out = (c.tolist(), g.tolist(), str(g.device), dist.get_backend())")
        values = ranks.pull("out")
    assert values == [([n, n], [n, n], f"cuda:{r}", GPU_AND_CPU) for r in range(n)]


# -- the course's comparisons on a machine with CUDA ---------------------------------------------
def test_ddp_equals_one_process_on_the_ranks_device():
    """Notebook 05: with one rank, "auto" puts it on the GPU; its reference runs there too,
    and one rank is then exact (a CPU reference would differ by the devices' rounding)."""
    from ddp_lab.course.ch05_ddp_basics import equivalence
    comparison = equivalence.compare_world_sizes((1, 2))  # asserts with assert_close
    one = comparison["world_sizes"][1]
    assert one["device"] == "cuda:0" and "cuda:0" in comparison["references"]
    worst = max(max(one["max_diff"]["grads"]), max(one["max_diff"]["weights"]))
    assert worst == 0, f"1 rank on cuda:0 vs the same steps in one process there: {worst:g}"
    cpu_vs_gpu = max((a - b).abs().max().item() for a, b in zip(
        comparison["references"]["cuda:0"]["weights"], comparison["reference"]["weights"]))
    print(f"notebook 05: DDP 1 rank on cuda:0 == one process on cuda:0 (0 difference); "
          f"one process on cuda:0 vs on the CPU: up to {cpu_vs_gpu:.1e}; 2 ranks on "
          f"{comparison['world_sizes'][2]['device']}")


def powersgd_on_cpu_tensors(steps: int = 3) -> str:
    """PowerSGD (compressing from step 2) on a CPU model: "ok", or the first error line."""
    from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook
    from torch.nn.parallel import DistributedDataParallel as DDP
    torch.manual_seed(0)
    ddp = DDP(torch.nn.Sequential(torch.nn.Linear(32, 32), torch.nn.Linear(32, 4)))
    ddp.register_comm_hook(powerSGD_hook.PowerSGDState(
        process_group=None, matrix_approximation_rank=1, start_powerSGD_iter=2,
        min_compression_rate=0.5), powerSGD_hook.powerSGD_hook)
    try:
        for _ in range(steps):
            ddp(torch.randn(8, 32)).square().mean().backward()
    except RuntimeError as exc:
        return str(exc).splitlines()[0]
    return "ok"


def test_powersgd_needs_cuda_tensors_wherever_cuda_is_available():
    """Notebook 07: torch's PowerSGD hook synchronizes CUDA whenever it is available, so it
    fails on CPU tensors here; with the GPUs hidden (what the network lesson does) it runs."""
    from ddp_lab.course.ch07_inside_ddp import network_costs
    seen = ddp_lab.run(powersgd_on_cpu_tensors, world_size=2, backend="gloo", echo=False)
    assert all("Expected a cuda device, but got: cpu" in v for v in seen.values), seen.values
    hidden = ddp_lab.run(powersgd_on_cpu_tensors, world_size=2, backend="gloo",
                         env=network_costs.CPU_ONLY, echo=False)
    assert hidden.values == ["ok", "ok"]
    print("PowerSGD on CPU tensors with CUDA available:", seen.values[0])


def test_hooks_comparison_trains_on_the_gpu():
    """Notebook 07's hooks comparison: on a GPU (shared by 2 ranks under gloo), same bytes."""
    from ddp_lab.course.ch07_inside_ddp import comm_hooks
    res = ddp_lab.run(comm_hooks.compare_hooks, world_size=2, kwargs={"steps": 4}, echo=False)
    params = comm_hooks.HOOK_MODEL.parameters
    for rank, per_rank in enumerate(res.values):
        assert {r["device"] for r in per_rank.values()} == {
            "cuda:0" if _gpus() < 2 else f"cuda:{rank}"}
        assert per_rank["all-reduce (default)"]["bytes"] == [4 * params] * 4
        assert per_rank["fp16 compression"]["bytes"] == [2 * params] * 4
        assert per_rank["int8 (custom)"]["bytes"] == [params + 4] * 4
        assert per_rank["PowerSGD rank 1"]["bytes"][-1] < 4 * params / 10
