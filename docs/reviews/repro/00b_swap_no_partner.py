"""00b checker: can `_differ(model, seed, "swap")` find no second weight to swap with?

`_differ` picks one trainable tensor and index i, then `next(j for j ... if flat[j] != flat[i])`.
If every element of the picked tensor holds the same value, `next` raises StopIteration on the
odd rank, inside the checker's own code. Pure CPU, no ranks: scans seeds like `new_seed()` draws.
Run from the root of a checkout of 46d1faf: .venv/bin/python docs/reviews/repro/00b_swap_no_partner.py
"""
import torch

from ddp_lab.course.ch00_launching.exercises_b import DIFFERENCES, _differ, _model
from ddp_lab.exercises.driver import generator

torch.set_num_threads(1)
hits, tried = [], 0
for seed in range(1, 20001):
    order = torch.randperm(len(DIFFERENCES), generator=generator(seed, 1)).tolist()
    if "swap" not in [DIFFERENCES[order[(n - 2) % 3]] for n in (2, 3, 4)]:
        continue
    tried += 1
    try:
        _differ(_model(seed), seed, "swap")
    except (StopIteration, RuntimeError) as exc:
        hits.append((seed, type(exc).__name__))
print(f"seeds tried: {tried}; swap found no partner on {len(hits)}: {hits[:10]}")
