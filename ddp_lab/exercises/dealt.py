"""Every rank's inputs, made by the checker and handed out one per rank (sealed.py runs the
learner's function; a trial takes its rank's item first)."""

from __future__ import annotations

import pickle

from ddp_lab.launch import payload


class Dealt:
    """Every rank's inputs, made by the checker: each rank takes its own, and the others'
    are wiped from its memory before the learner's function runs."""

    def __init__(self, per_rank: list):
        self.items = [bytearray(payload.dumps(value)) for value in per_rank]

    def take(self, rank: int | None = None):
        """This rank's item (``rank`` defaults to ``dist.get_rank()``); every item's bytes
        are zeroed in place, so a second take, or a look at this object, finds nothing."""
        if self.items is None:
            raise RuntimeError("these inputs were taken already")
        if rank is None:
            import torch.distributed as dist
            rank = dist.get_rank()
        mine = pickle.loads(bytes(self.items[rank]))
        for item in self.items:
            item[:] = bytes(len(item))
        self.items = None
        return mine


def deal(per_rank: list) -> Dealt:
    """``per_rank[r]`` for rank r only: pass the result in a trial's arguments, and call
    ``.take()`` on it in the rank before the learner's function runs."""
    return Dealt(per_rank)

