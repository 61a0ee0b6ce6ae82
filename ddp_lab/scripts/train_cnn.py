"""Train DigitsCNN with DDP: a typical torchrun MNIST CNN script, runnable anywhere.

    torchrun --standalone --nproc-per-node=2 -m ddp_lab.scripts.train_cnn --epochs 10
    torchrun --nnodes=2 --nproc-per-node=2 --rdzv-backend=c10d \\
        --rdzv-endpoint=HOST:29400 --rdzv-id=1 -m ddp_lab.scripts.train_cnn
    ddp_lab.run_script(script_path("train_cnn.py"), world_size=2, script_args=[...])

Data: ``--data digits`` (bundled with scikit-learn, offline) or a folder with the MNIST IDX
files. ``--checkpoint PATH`` saves after every epoch and resumes when PATH exists, which is
what ``torchrun --max-restarts`` needs to recover from a lost worker.
"""

from __future__ import annotations

import argparse
import os
from dataclasses import fields

import torch.distributed as dist
# Before any group exists, or DDP's constructor imports it (through torch._dynamo) and its
# functions' defaults, ``group=group.WORLD`` (torch/distributed/nn/functional.py), keep the
# default group alive after destroy_process_group(): gloo's worker threads then run into
# the interpreter's exit, and one that drops its last work there (that work holds a Python
# object, which needs the GIL) aborts the process with "terminate called without an active
# exception" (SIGABRT) after the script's last line. Imported first, the defaults are None,
# and destroy_process_group() joins those threads while Python is still fully alive.
import torch.distributed.nn  # noqa: F401

import ddp_lab
from ddp_lab.course.data import load_dataset
from ddp_lab.course.training import TrainConfig, rank_device, train
from ddp_lab.launch.backends import machine_backend

DEFAULTS = TrainConfig()


def parse_args(argv=None) -> TrainConfig:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--epochs", type=int, default=DEFAULTS.epochs)
    parser.add_argument("--batch-size", type=int, default=DEFAULTS.batch_size,
                        help="per rank; the global batch is this times the world size")
    parser.add_argument("--lr", type=float, default=DEFAULTS.lr)
    parser.add_argument("--data", default=DEFAULTS.data, help="'digits' or an MNIST folder")
    parser.add_argument("--checkpoint", default=None, help="save each epoch; resume if present")
    parser.add_argument("--seed", type=int, default=DEFAULTS.seed)
    parser.add_argument("--log-every", type=int, default=DEFAULTS.log_every)
    parser.add_argument("--no-progress", dest="progress", action="store_false")
    args = vars(parser.parse_args(argv))
    if args["epochs"] < 1 or args["batch_size"] < 1 or args["lr"] <= 0:
        parser.error("--epochs and --batch-size must be >= 1 and --lr > 0")
    return TrainConfig(**{f.name: args[f.name] for f in fields(TrainConfig) if f.name in args})


def main(argv=None) -> None:
    config = parse_args(argv)
    load_dataset(config.data)  # a bad --data fails here, before any rendezvous
    # "cpu:gloo,cuda:nccl" if each rank on this machine has a GPU of its own, else "gloo"
    backend = machine_backend(int(os.environ.get("LOCAL_WORLD_SIZE", 1)))
    dist.init_process_group(backend, init_method="env://")
    print(f"Initialized process group with rank {dist.get_rank()}.", flush=True)
    print(f"Running on rank {dist.get_rank()}. (local device: {rank_device()})", flush=True)
    result = train(config)
    if dist.get_rank() == 0:
        print(f"Throughput: {result['samples_per_s']:.0f} samples/s", flush=True)
    ddp_lab.report(result)
    dist.barrier()  # every rank is done before any of them closes its connections
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
