"""One all_reduce round trip: the smallest complete distributed program.

    torchrun --standalone --nproc-per-node 4 all_reduce_once.py
    ddp_lab.run_script(script_path("all_reduce_once.py"), world_size=4)

Both start the ranks with the torchrun environment (RANK, WORLD_SIZE, MASTER_ADDR, ...), so
``init_method="env://"`` works the same under either.
"""

import argparse

import torch
import torch.distributed as dist

import ddp_lab


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--size", type=int, default=1, help="elements in the tensor")
    args = parser.parse_args()
    backend = "nccl" if torch.cuda.is_available() else "gloo"
    dist.init_process_group(backend, init_method="env://")
    device = f"cuda:{torch.cuda.current_device()}" if backend == "nccl" else "cpu"
    t = torch.full((args.size,), float(dist.get_rank()), device=device)
    dist.all_reduce(t)
    print(f"rank {dist.get_rank()}: sum of ranks = {t[0].item():g}")
    ddp_lab.report(t[0].item())
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
