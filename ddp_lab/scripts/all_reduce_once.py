"""One all_reduce round trip: the smallest complete distributed program.

    torchrun --standalone --nproc-per-node 4 all_reduce_once.py
    ddp_lab.run_script(script_path("all_reduce_once.py"), world_size=4)

Both start the ranks with the torchrun environment (RANK, WORLD_SIZE, MASTER_ADDR, ...), so
``init_method="env://"`` works the same under either.
"""

import argparse
import os

import torch
import torch.distributed as dist

import ddp_lab
from ddp_lab.launch.backends import machine_backend, uses_nccl


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--size", type=int, default=1, help="elements in the tensor")
    args = parser.parse_args()
    # "cpu:gloo,cuda:nccl" if each rank on this machine has a GPU of its own, else "gloo"
    backend = machine_backend(int(os.environ.get("LOCAL_WORLD_SIZE", 1)))
    if uses_nccl(backend):
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
    dist.init_process_group(backend, init_method="env://")
    device = f"cuda:{torch.cuda.current_device()}" if uses_nccl(backend) else "cpu"
    t = torch.full((args.size,), float(dist.get_rank()), device=device)
    dist.all_reduce(t)
    print(f"rank {dist.get_rank()}: sum of ranks = {t[0].item():g}")
    ddp_lab.report(t[0].item())
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
