"""Notebook 05, part 1: what DistributedDataParallel does around one training step.

The ToyModel of PyTorch's DDP tutorial wrapped in DDP
(https://pytorch.org/tutorials/intermediate/ddp_tutorial.html). The constructor broadcasts
rank 0's parameters and buffers, a forward broadcasts the buffers again (when the model has
any and the forward before it ran with grad enabled; the second training forward also
broadcasts the rebuilt bucket layout), and backward averages the gradients with all_reduce
while it runs: synchronization points that every rank must reach, in the same order. The GPU path (device from LOCAL_RANK,
``set_device`` before the model exists, ``device_ids=[local_rank]``) is taken whenever the
group sends CUDA tensors through NCCL.
"""

from __future__ import annotations

import os
import re
import time

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

from ddp_lab.course.models import ToyModel, ToyMpModel
from ddp_lab.course.params import device_ids, flat_grads, flat_params
from ddp_lab.course.training import rank_device
from ddp_lab.launch.backends import uses_nccl

SYNC_POINTS = ("construct", "forward", "backward")


def tutorial_basic_example() -> float:
    """The DDP tutorial's ``demo_basic``: one SGD step of ToyModel on random data."""
    rank = dist.get_rank()
    print(f"Running basic DDP example on rank {rank}.")
    device = rank_device()  # on GPUs: set_device(LOCAL_RANK) before any CUDA allocation
    torch.manual_seed(0)  # set explicitly: the same initial model on every rank
    model = ToyModel().to(device)
    ddp_model = DDP(model, device_ids=device_ids(device))
    torch.manual_seed(1 + rank)  # but each rank its own random data
    loss_fn = nn.MSELoss()
    optimizer = torch.optim.SGD(ddp_model.parameters(), lr=0.001)

    optimizer.zero_grad()
    outputs = ddp_model(torch.randn(20, 10, device=device))
    labels = torch.randn(20, 5, device=device)
    loss = loss_fn(outputs, labels)
    loss.backward()
    optimizer.step()
    print(f"Loss on rank {rank}: {loss}")
    return loss.item()


def anatomy_of_a_step(lr: float = 0.1) -> dict:
    """One DDP step, recorded at every stage, with a deliberately different model per rank.

    Returns this rank's parameters before and after ``DDP(...)``, its local gradient (the
    gradient of its own shard, computed under ``no_sync`` so nothing is exchanged), the
    gradient DDP leaves in ``.grad`` after a normal backward, and the parameters after the
    optimizer step.
    """
    rank = dist.get_rank()
    device = rank_device()
    torch.manual_seed(rank)  # a different initial model on every rank, on purpose
    model = ToyModel().to(device)
    record = {"before": flat_params(model)}
    ddp_model = DDP(model, device_ids=device_ids(device))
    record["after"] = flat_params(model)
    data = torch.Generator().manual_seed(100 + rank)  # each rank its own shard of the batch
    x, y = torch.randn(8, 10, generator=data), torch.randn(8, 5, generator=data)
    x, y = x.to(device), y.to(device)
    with ddp_model.no_sync():  # backward without the all_reduce: this rank's own gradient
        nn.functional.mse_loss(ddp_model(x), y).backward()
    record["local_grad"] = flat_grads(model)
    model.zero_grad()
    nn.functional.mse_loss(ddp_model(x), y).backward()  # the all_reduce runs in here
    record["synced_grad"] = flat_grads(model)
    torch.optim.SGD(model.parameters(), lr=lr).step()
    record["stepped"] = flat_params(model)
    return record


def toy_with_buffers() -> nn.Module:
    """ToyModel followed by BatchNorm1d: its running mean is a buffer, so DDP's forward
    has something to broadcast (ToyModel alone has no buffers)."""
    return nn.Sequential(ToyModel(), nn.BatchNorm1d(5))


def buffers_in_forward(steps: int = 3) -> dict:
    """The BatchNorm running mean on this rank as forward sees it on entry (after DDP's
    broadcast) and as forward leaves it (updated from this rank's own batch)."""
    rank = dist.get_rank()
    device = rank_device()
    torch.manual_seed(0)
    model = toy_with_buffers().to(device)
    ddp_model = DDP(model, device_ids=device_ids(device))
    norm = model[1]
    seen = {"on_entry": [], "on_exit": []}
    norm.register_forward_pre_hook(
        lambda module, args: seen["on_entry"].append(module.running_mean.cpu().clone()))
    data = torch.Generator().manual_seed(rank)
    for _ in range(steps):
        ddp_model(torch.randn(8, 10, generator=data).to(device)).sum().backward()
        seen["on_exit"].append(norm.running_mean.cpu().clone())
    return seen


FORWARDS = ("train", "train", "train", "no_grad", "no_grad", "train")


def collectives_per_forward(forwards=FORWARDS) -> dict[str, list[dict]]:
    """The collectives DDP issues inside each forward (and its backward, for "train"), for
    ToyModel (no buffers) and ToyModel + BatchNorm1d (buffers), as ``forwards`` run in turn.
    Watched at the dispatcher (``CollectiveTrace``), so the Reducer's own calls count too."""
    from ddp_lab.course.collective_trace import CollectiveTrace
    device, out = rank_device(), {}
    for name, make in (("ToyModel", ToyModel), ("ToyModel + BatchNorm1d", toy_with_buffers)):
        torch.manual_seed(0)
        ddp_model, rows = DDP(make().to(device), device_ids=device_ids(device)), []
        for kind in forwards:
            with CollectiveTrace(dist.get_world_size()) as forward, \
                    torch.set_grad_enabled(kind == "train"):
                output = ddp_model(torch.randn(8, 10, device=device))
            with CollectiveTrace(dist.get_world_size()) as backward:
                if kind == "train":
                    output.sum().backward()
            rows.append({"forward": kind, "in forward": [c.name for c in forward.calls],
                         "in backward": [c.name for c in backward.calls]})
        out[name] = rows
    return out


def sync_batchnorm_on_this_device() -> str:
    """One training forward of ``convert_sync_batchnorm(toy_with_buffers())`` on this rank's
    device: "ok" where SyncBatchNorm runs (GPUs), else the error it raises. In torch 2.13
    ``SyncBatchNorm.forward`` (torch/nn/modules/batchnorm.py) refuses CPU tensors whenever
    a process group is initialized and the module is training."""
    model = nn.SyncBatchNorm.convert_sync_batchnorm(toy_with_buffers()).to(rank_device())
    try:
        model(torch.randn(8, 10, device=rank_device())).sum().backward()
        return "ok"
    except ValueError as err:
        return f"ValueError: {err}"


def buffer_facts(per_rank: list[dict]) -> list[dict]:
    """Per forward of buffers_in_forward: were the running means identical on every rank on
    entry, equal to rank 0's from the forward before, and identical on exit?"""
    facts = []
    for step in range(len(per_rank[0]["on_entry"])):
        entry = [r["on_entry"][step] for r in per_rank]
        exits = [r["on_exit"][step] for r in per_rank]
        facts.append({
            "identical on entry": all(torch.equal(e, entry[0]) for e in entry),
            "rank 0's previous exit": step > 0 and torch.equal(
                entry[0], per_rank[0]["on_exit"][step - 1]),
            "identical on exit": all(torch.equal(e, exits[0]) for e in exits)})
    return facts


def straggle_at(where: str = "backward", hold_s: float = 3600.0) -> int:
    """Every rank trains one step of toy_with_buffers, but the last rank never reaches the
    synchronization point ``where`` (it sleeps there instead, standing for a slow data
    loader, a rank-0-only evaluation, or an ``if`` only one rank takes); the others wait."""
    if where not in SYNC_POINTS:
        raise ValueError(f"where must be one of {SYNC_POINTS}, not {where!r}")
    absent = dist.get_rank() == dist.get_world_size() - 1
    device = rank_device()
    torch.manual_seed(0)
    model = toy_with_buffers().to(device)
    if absent and where == "construct":
        time.sleep(hold_s)
    ddp_model = DDP(model, device_ids=device_ids(device))
    if absent and where == "forward":
        time.sleep(hold_s)
    out = ddp_model(torch.randn(8, 10, device=device))
    if absent and where == "backward":
        time.sleep(hold_s)
    out.sum().backward()
    return dist.get_rank()


def hang_summary(stacks: dict[int, str]) -> dict[int, str]:
    """Per stuck rank (WorkerTimeout.stacks), the line of ``straggle_at`` it was on and the
    innermost call it waited in, e.g. ``out.sum().backward()  ->  in _engine_run_backward``."""
    summary = {}
    for rank, stack in stacks.items():
        frames = _FRAME.findall(stack)  # (function, source line), oldest call first
        mine = [source for function, source in frames if function == "straggle_at"]
        line = mine[-1] if mine else "?"
        inner = frames[-1][0] if frames else "straggle_at"
        summary[rank] = line if inner == "straggle_at" else f"{line}  ->  in {inner}"
    return summary


_FRAME = re.compile(r'File "[^"]*", line \d+, in (\w+)\n\s+(.*)')


def model_parallel_devices() -> tuple:
    """(dev0, dev1) for the tutorial's ToyMpModel: GPUs 2*local_rank and 2*local_rank + 1 under
    NCCL (each process owns two GPUs), both "cpu" under gloo."""
    if not uses_nccl(dist.get_backend()):
        return "cpu", "cpu"
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    dev0, dev1 = 2 * local_rank, 2 * local_rank + 1
    if torch.cuda.device_count() <= dev1:
        raise RuntimeError(f"rank {dist.get_rank()} needs GPUs {dev0} and {dev1} but this "
                           f"machine has {torch.cuda.device_count()}: run with backend='gloo' "
                           "(see model_parallel_backend) or half as many ranks")
    torch.cuda.set_device(dev0)  # stray allocations land on this rank's own GPU, not GPU 0
    return dev0, dev1


def model_parallel_backend(world_size: int) -> str:
    """NCCL only if every rank can have two GPUs; otherwise the CPU with gloo."""
    enough = torch.cuda.is_available() and torch.cuda.device_count() >= 2 * world_size
    return "nccl" if enough else "gloo"


def model_parallel_step() -> dict:
    """The DDP tutorial's ``demo_model_parallel``: one replica spans two devices, so DDP gets no
    ``device_ids`` and the module itself decides where the output lives (dev1)."""
    rank = dist.get_rank()
    print(f"Running DDP with model parallel example on rank {rank}.")
    dev0, dev1 = model_parallel_devices()
    torch.manual_seed(0)
    mp_model = ToyMpModel(dev0, dev1)
    ddp_mp_model = DDP(mp_model)
    torch.manual_seed(1 + rank)
    loss_fn = nn.MSELoss()
    optimizer = torch.optim.SGD(ddp_mp_model.parameters(), lr=0.001)

    optimizer.zero_grad()
    outputs = ddp_mp_model(torch.randn(20, 10))  # outputs will be on dev1
    labels = torch.randn(20, 5).to(dev1)
    loss = loss_fn(outputs, labels)
    loss.backward()
    optimizer.step()
    return {"devices": (str(mp_model.net1.weight.device), str(mp_model.net2.weight.device)),
            "output_device": str(outputs.device), "loss": loss.item(),
            "weights": flat_params(mp_model)}
