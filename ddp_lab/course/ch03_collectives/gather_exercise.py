"""The checker for notebook 03's exercise: all_gather written with other collectives, run on
real ranks and compared with ``dist.all_gather``."""

from __future__ import annotations

import torch

from ddp_lab.course.ch03_collectives.collectives import all_gather, rank_and_world, rank_values

def _exercise_worker(fn, numel: int) -> dict:
    rank, world = rank_and_world()
    mine = fn(rank_values(rank, numel, "float32"))
    return {"mine": mine, "builtin": all_gather(numel, "float32")["after"]}


def check_all_gather(fn, world_sizes=(2, 3, 4), numel: int = 3, timeout: float = 30.0) -> str:
    """Runs the learner's ``fn(tensor) -> list of world_size tensors`` on real ranks and
    compares it with dist.all_gather, rank by rank and entry by entry."""
    import ddp_lab
    for n in world_sizes:
        try:
            res = ddp_lab.run(_exercise_worker, n, args=(fn, numel), timeout=timeout,
                              echo=False)
        except ddp_lab.WorkerTimeout as err:
            raise AssertionError(
                f"with {n} ranks your function hung (ranks {err.stuck_ranks} stuck): every "
                "rank must call broadcast the same number of times, with the same src in the "
                "same order.") from None
        except ddp_lab.WorkerError as err:
            raise AssertionError(f"with {n} ranks, rank {err.rank} failed:\n{err.traceback}") \
                from None
        for rank, value in enumerate(res.values):
            _compare_gathered(value["mine"], value["builtin"], n, rank)
    return f"passed on {', '.join(map(str, world_sizes))} ranks"


def _compare_gathered(mine, builtin, n: int, rank: int) -> None:
    where = f"with {n} ranks, rank {rank}"
    if not isinstance(mine, (list, tuple)) or len(mine) != n:
        raise AssertionError(f"{where} returned {mine!r}: expected a list of {n} tensors, "
                             "entry i being rank i's tensor")
    for i, (got, want) in enumerate(zip(mine, builtin)):
        if not (isinstance(got, torch.Tensor) and got.shape == want.shape
                and torch.equal(got, want)):
            raise AssertionError(f"{where}: entry {i} is {got!r}, expected rank {i}'s "
                                 f"tensor {want!r}")
