"""Elastic training in miniature: a loop of steps that survives workers coming and going.

    torchrun --nnodes=1:2 --nproc-per-node=2 --rdzv-backend=c10d \\
        --rdzv-endpoint=HOST:29400 --rdzv-id=job elastic_steps.py --state /shared/state.json

Each step all_reduces a 1 from every worker (so all of them agree on the world size) and
sleeps ``--step-s`` (the "work"). Rank 0 records the next step in ``--state`` after every
step and every worker starts from it, so when torchrun restarts the workers (a node
joined, or a worker failed and ``--max-restarts`` allows another try) the job continues
where it was instead of starting over: the job-level checkpoint every elastic script needs.

``--trace FILE`` appends one JSON line per worker and step (for the notebook's timeline);
``--fail-rank R --fail-at-step K`` makes rank R raise at step K, on the first attempt only
(``TORCHELASTIC_RESTART_COUNT == 0``): the failure ``--max-restarts`` recovers from.
``--hold-at-step K --hold-for-world N`` makes workers in a world smaller than N wait at step
K until torchrun restarts them in a bigger one (a node joined): on a busy laptop the second
node's agent may take longer to start than the whole job, and the demo of a node joining
would then show nothing. (A membership change is no failure: TORCHELASTIC_RESTART_COUNT
stays 0, so the world size is what tells the rounds apart.)
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import torch
import torch.distributed as dist

import ddp_lab


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=20, help="steps the whole job makes")
    parser.add_argument("--step-s", type=float, default=0.2, help="seconds of work per step")
    parser.add_argument("--state", required=True, help="the job's progress (shared path)")
    parser.add_argument("--trace", default=None, help="append a JSON line per step here")
    parser.add_argument("--fail-rank", type=int, default=None)
    parser.add_argument("--fail-at-step", type=int, default=None)
    parser.add_argument("--hold-at-step", type=int, default=None,
                        help="wait at this step while the world is smaller than...")
    parser.add_argument("--hold-for-world", type=int, default=0, help="...this many workers")
    return parser.parse_args(argv)


def main(argv=None) -> None:
    args = parse_args(argv)
    dist.init_process_group("gloo", init_method="env://")
    rank, restart = dist.get_rank(), int(os.environ.get("TORCHELASTIC_RESTART_COUNT", 0))
    step = _read_state(args.state)
    print(f"rank {rank}: world size {dist.get_world_size()}, restart {restart}, starting at "
          f"step {step}", flush=True)
    while step < args.steps:
        began = time.time()
        if rank == args.fail_rank and step == args.fail_at_step and restart == 0:
            raise RuntimeError(f"rank {rank} failed at step {step} (a simulated crash)")
        if step == args.hold_at_step and dist.get_world_size() < args.hold_for_world:
            _hold(rank, step)
        world = torch.ones(1)
        dist.all_reduce(world)
        time.sleep(args.step_s)
        _trace(args.trace, step, int(world.item()), restart, began)
        step += 1
        if rank == 0:
            _write_state(args.state, step)
    print(f"rank {rank}: done after step {step - 1}", flush=True)
    ddp_lab.report({"world_size": dist.get_world_size(), "restart": restart, "steps": step})
    dist.destroy_process_group()


def _hold(rank: int, step: int) -> None:
    """Wait for torchrun to stop this worker (SIGTERM) and start a new round."""
    print(f"rank {rank}: holding at step {step} until the world grows", flush=True)
    while True:
        time.sleep(0.1)


def _read_state(path: str) -> int:
    try:
        return json.loads(Path(path).read_text())["step"]
    except FileNotFoundError:
        return 0


def _write_state(path: str, step: int) -> None:
    tmp = Path(f"{path}.tmp")
    tmp.write_text(json.dumps({"step": step}))
    os.replace(tmp, path)  # a worker restarting now never reads half a file


def _trace(path: str | None, step: int, world: int, restart: int, began: float) -> None:
    if not path:
        return
    record = {"rank": dist.get_rank(), "local_rank": int(os.environ["LOCAL_RANK"]),
              "group_rank": int(os.environ["GROUP_RANK"]), "agent_pid": os.getppid(),
              "pid": os.getpid(),
              "world_size": world, "restart": restart, "step": step, "start": began,
              "end": time.time()}
    with open(path, "a") as trace:  # one short write per line: appends do not interleave
        trace.write(json.dumps(record) + "\n")


if __name__ == "__main__":
    main()
