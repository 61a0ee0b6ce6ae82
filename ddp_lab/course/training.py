"""Data-parallel training of DigitsCNN: a typical torchrun MNIST CNN script, as a library.

``train(config)`` runs inside an initialized process group, so the same code serves
``ddp_lab.run``, ``ddp_lab.run_script``, plain ``torchrun`` and multi-node torchrun.
It is deterministic on CPU: every epoch reseeds from (seed, epoch, rank) and the sampler
shuffles by ``set_epoch``, so a run resumed from an epoch checkpoint continues exactly as
one that was never interrupted (notebook 08 kills one to show it): bit for bit on 1 or 2
ranks, to float rounding on 3 or more. A new process's DDP lays its gradient bucket out in
registration order and rebuilds it in gradient-ready order after the first step, so the
first step after a resume feeds the ring all-reduce a different layout, and a sum of three
or more floats depends on its order.
"""

from __future__ import annotations

import os
import sys
import time
from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, Subset

from ddp_lab.course.checkpoint import load_if_present, save_on_rank0
from ddp_lab.course.data import load_dataset
from ddp_lab.course.models import DigitsCNN
from ddp_lab.launch.backends import uses_nccl


@dataclass(frozen=True)
class TrainConfig:
    """Defaults reach >= 95% test accuracy on the bundled digits in seconds on a CPU."""

    epochs: int = 10
    batch_size: int = 32  # per rank: the global batch is batch_size * world_size
    lr: float = 0.05
    momentum: float = 0.9
    data: str = "digits"
    checkpoint: str | None = None  # saved after every epoch, resumed from when present
    seed: int = 0
    log_every: int = 10  # batches between "Epoch [e/E], Batch [b/B]" lines
    progress: bool = True  # a bar on rank 0 where a terminal or notebook shows one


def rank_device() -> torch.device:
    """This rank's GPU (from LOCAL_RANK) when the group sends CUDA tensors through NCCL
    (``"nccl"``, or ``"cpu:gloo,cuda:nccl"``, which ``backend="auto"`` picks with a GPU per
    rank and ``dist.get_backend()`` returns as it is), else the CPU.

    ``set_device`` comes before the model is built so that rank r never creates a CUDA
    context or allocates on GPU 0 (https://github.com/pytorch/examples/issues/969).
    """
    if not uses_nccl(dist.get_backend()):
        return torch.device("cpu")
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    torch.cuda.set_device(local_rank)
    return torch.device("cuda", local_rank)


def train(config: TrainConfig = TrainConfig()) -> dict:
    """Train on this rank's shard; return this rank's curves, accuracy and final weights."""
    rank, device = dist.get_rank(), rank_device()
    train_set, test_set = load_dataset(config.data)
    torch.manual_seed(config.seed)  # same initial model everywhere (DDP broadcasts anyway)
    model = DigitsCNN().to(device)
    ddp_model = DDP(model, device_ids=[device.index] if device.type == "cuda" else None)
    optimizer = torch.optim.SGD(ddp_model.parameters(), lr=config.lr, momentum=config.momentum)
    start = _resume(config, model, optimizer, device)
    sampler = DistributedSampler(train_set, shuffle=True, seed=config.seed)
    loader = DataLoader(train_set, batch_size=config.batch_size, sampler=sampler)
    history = {"batch_losses": [], "epoch_losses": [], "epochs_run": [], "seconds": 0.0}
    samples = 0
    for epoch in range(start, config.epochs):
        sampler.set_epoch(epoch)  # a new shuffle each epoch, the same on every rank
        torch.manual_seed(config.seed + 1000 * epoch + rank)  # per-rank randomness, resumable
        began = time.perf_counter()
        losses = _train_epoch(ddp_model, loader, optimizer, epoch, config, device)
        history["seconds"] += time.perf_counter() - began
        samples += len(train_set)  # the job's: each sample once (the sampler pads with repeats)
        _end_epoch(history, losses, epoch, config, model, optimizer, device)
    accuracy = evaluate(model, test_set, device)
    _log(f"Test accuracy: {accuracy:.2f}%")
    return _summary(history, samples, accuracy, model, device)


def _train_epoch(ddp_model, loader, optimizer, epoch, config, device) -> list[float]:
    ddp_model.train()
    losses = []
    with _progress_bar(len(loader), f"epoch {epoch}", config) as bar:
        for batch, (images, labels) in enumerate(loader):
            optimizer.zero_grad()
            loss = F.cross_entropy(ddp_model(images.to(device)), labels.to(device))
            loss.backward()  # DDP averages the gradients across ranks here
            optimizer.step()
            losses.append(loss.item())
            if batch % config.log_every == 0:
                _log(f"Epoch [{epoch}/{config.epochs}], Batch [{batch}/{len(loader)}], "
                     f"Loss: {loss.item():.4f}", bar)
            bar.update(1)
    return losses


def _end_epoch(history, losses, epoch, config, model, optimizer, device) -> None:
    mean = torch.tensor(sum(losses) / len(losses), device=device)
    dist.all_reduce(mean)  # the log line reports all ranks' loss, not just rank 0's shard
    epoch_loss = mean.item() / dist.get_world_size()
    _log(f"Epoch [{epoch}/{config.epochs}] completed. Loss: {epoch_loss:.4f}")
    history["batch_losses"] += losses
    history["epoch_losses"].append(epoch_loss)
    history["epochs_run"].append(epoch)
    if config.checkpoint:
        save_on_rank0(config.checkpoint, {"epoch": epoch, "model": model.state_dict(),
                                          "optimizer": optimizer.state_dict()})


def _resume(config, model, optimizer, device) -> int:
    """The first epoch still to run: 0, or the one after the checkpoint's."""
    state = load_if_present(config.checkpoint, device)
    if state is None:
        return 0
    model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    _log(f"Resumed from {config.checkpoint} after epoch {state['epoch']}.")
    return state["epoch"] + 1


@torch.no_grad()
def evaluate(model, test_set, device) -> float:
    """Test accuracy in % over the whole test set, each sample counted exactly once.

    DistributedSampler would pad the shards with duplicates to equal length; a strided
    Subset does not, and the counts are summed across ranks.
    """
    model.eval()
    shard = Subset(test_set, range(dist.get_rank(), len(test_set), dist.get_world_size()))
    counts = torch.zeros(2, device=device)
    for images, labels in DataLoader(shard, batch_size=256):
        predicted = model(images.to(device)).argmax(dim=1)
        counts += torch.tensor([(predicted == labels.to(device)).sum().item(), len(labels)],
                               device=device)
    dist.all_reduce(counts)
    return 100.0 * counts[0].item() / counts[1].item()


def _summary(history: dict, samples: int, accuracy: float, model, device) -> dict:
    """The job's samples/s as notebook 06's exercise defines it: every sample the job
    trained on over the slowest rank's time (the others waited for it at every step)."""
    seconds = history.pop("seconds")
    weights = torch.cat([p.detach().cpu().flatten() for p in model.parameters()])
    slowest = torch.tensor([seconds], dtype=torch.float64, device=device)
    dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
    throughput = samples / slowest.item() if slowest.item() else 0.0
    return {**history, "accuracy": accuracy, "samples_per_s": throughput,
            "train_seconds": seconds, "final_weights": weights}


def _log(line: str, bar=None) -> None:
    """Rank 0 speaks for the job (``Epoch [e/E], Batch [b/B], Loss: x``, the usual MNIST
    script's log lines); above the bar when there is one."""
    if dist.get_rank() != 0:
        return
    if bar is not None and not bar.disable:
        bar.write(line)
    else:
        print(line, flush=True)


def _progress_bar(total: int, label: str, config: TrainConfig):
    """tqdm on rank 0 when someone watches: a terminal, or a ddp_lab run (notebook/CLI)."""
    from tqdm import tqdm

    watched = sys.stderr.isatty() or "DDP_LAB_RUN_DIR" in os.environ
    show = config.progress and watched and dist.get_rank() == 0
    return tqdm(total=total, desc=label, disable=not show, file=sys.stderr, ncols=80,
                mininterval=0.5, leave=False)
