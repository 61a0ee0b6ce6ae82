"""Notebook 12's exercise: one step of the online softmax, the merge at the heart of ring
attention.

The learner writes ``online_softmax_step(acc, m, l, scores, v)``. The check runs
``scratch.ring_attention``'s own ring on 1 to 4 ranks with the learner's step in place of
the reference, on random shapes, causal and not, and with scores large enough that
``exp(score)`` overflows float32, then compares each rank's output rows and each row's
normalizer ``m + log(l)`` with attention over the whole sequence in one process.
"""

from __future__ import annotations

import importlib
import math

import torch
import torch.distributed as dist
import torch.nn.functional as F

from ddp_lab.exercises.builtins_off import replaced
from ddp_lab.exercises.driver import WORLD_SIZES, generator, new_seed, run_ranks, where
from ddp_lab.exercises.registry import Exercise, ExerciseFailed
from ddp_lab.scratch.ring_attention import online_softmax_step

CHECK_TIMEOUT = 60.0
SCALES = (1.0, 40.0)  # 40: scores in the hundreds, exp() overflows without the max


def _ring():
    return importlib.import_module("ddp_lab.scratch.ring_attention")


def _problem(seed: int, world: int, scale: float):
    g = generator(seed, int(scale))
    batch, heads, per_rank, dim = (int(v) for v in torch.randint(1, 4, (4,), generator=g) + 1)
    q, k, v = (torch.randn(batch, heads, per_rank * world, dim, generator=g) for _ in range(3))
    return q * scale, k, v


def _trial(fn, seed: int) -> list:
    rank, world = dist.get_rank(), dist.get_world_size()
    ring, results = _ring(), []
    with replaced(ring, "online_softmax_step", fn):
        for scale in SCALES:
            for causal in (False, True):
                q, k, v = (t.chunk(world, dim=-2)[rank] for t in _problem(seed, world, scale))
                out, lse = ring._forward(q, k, v, causal, None, "contiguous")
                results.append({"out": out, "lse": lse, "scale": scale, "causal": causal})
    return results


def _expected(seed: int, world: int, scale: float, causal: bool) -> dict:
    q, k, v = _problem(seed, world, scale)
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    if causal:
        scores = scores.masked_fill(torch.ones_like(scores, dtype=torch.bool).triu(1), float("-inf"))
    return {"out": F.scaled_dot_product_attention(q, k, v, is_causal=causal).chunk(world, dim=-2),
            "lse": torch.logsumexp(scores, dim=-1).chunk(world, dim=-1)}


def _close(a, b) -> bool:
    return (isinstance(a, torch.Tensor) and a.shape == b.shape
            and torch.allclose(a, b, rtol=1e-4, atol=1e-4))


def _problem_with(got: dict, want: dict, rank: int) -> str | None:
    out, lse = got["out"], got["lse"]
    if not (torch.isfinite(out).all() and torch.isfinite(lse).all()):
        return ("the output holds inf or nan: exp() of a score in the hundreds overflows. "
                "Subtract the running maximum m before exp, and rescale what you had by "
                "exp(m_old - m_new)")
    lse_right, out_right = _close(lse, want["lse"][rank]), _close(out, want["out"][rank])
    if lse_right and out_right:
        return None
    if lse_right:
        return ("the running sum l and max m are right but the numerator acc is not: when the "
                "maximum grows, rescale the old acc by exp(m_old - m_new) before adding p @ v "
                "(and do not normalize inside a step: acc / l happens once, at the end)")
    return ("each row's normalizer m + log(l) differs from the logsumexp of its scores: m must "
            "be the running maximum (of the old m and this block's scores), and the old sum l "
            "must be rescaled by exp(m_old - m_new) before this block's sum of exp(scores - "
            "m_new) is added")


def check_online_softmax(fn) -> str:
    seed = new_seed()
    for n in WORLD_SIZES:
        on = where(n, seed)
        values = run_ranks(_trial, n, (fn, seed), where=on, timeout=CHECK_TIMEOUT,
                           hang_hint="The step computes on this rank only: no collective in it.")
        for rank, trials in enumerate(values):
            for got in trials:
                want = _expected(seed, n, got["scale"], got["causal"])
                problem = _problem_with(got, want, rank)
                if problem:
                    kind = "causal" if got["causal"] else "full"
                    raise ExerciseFailed(f"{on}, rank {rank}, {kind} attention, scores x"
                                         f"{got['scale']:g}: {problem}")
    return (f"ring attention with your step equals attention over the whole sequence on 1 to 4 "
            f"ranks, causal and not, with scores that overflow exp() (seed {seed})")


EXERCISES = (
    Exercise(
        name="12.online_softmax", notebook="12_sequence_parallelism",
        summary="online_softmax_step(acc, m, l, scores, v): fold one block into the running "
                "numerator, maximum and sum",
        hint="Keep m the running maximum (of the old m and this block's); before adding this "
             "block's exp(scores - m_new), rescale the old l and acc by exp(m - m_new).",
        solution=online_softmax_step, checker=check_online_softmax),
)
