"""Notebook 12's exercise: one step of the online softmax, the merge at the heart of ring
attention.

The learner writes ``online_softmax_step(acc, m, l, scores, v)``. The check runs
``scratch.ring_attention``'s own ring on 1 to 4 ranks with the learner's step in place of
the reference, on random shapes, causal and not, and with scores large enough that
``exp(score)`` overflows float32; each rank is dealt only its own slice of q, k and v,
made in the checker's process. It checks each step's ``m`` against the exact running
maximum (read before the step, which may work on the scores in place), then compares, in
the checker's process, each rank's output rows and each row's normalizer ``m + log(l)``
with attention over the whole sequence. The scratch
step is switched off however it is imported (its code object refuses while the check runs),
and a step that returns something other than three tensors shaped like (acc, m, l) hears so.
"""

from __future__ import annotations

import importlib
import math
import types

import torch
import torch.nn.functional as F

from ddp_lab.exercises.builtins_off import refused_everywhere
from ddp_lab.exercises.driver import each_world, generator, new_seed
from ddp_lab.exercises.registry import Exercise
from ddp_lab.exercises.sealed import deal
from ddp_lab.scratch.ring_attention import online_softmax_step

SCALES = (1.0, 40.0)  # 40: scores in the hundreds, exp() overflows without the max


def _ring():
    return importlib.import_module("ddp_lab.scratch.ring_attention")


def _problem(seed: int, world: int, scale: float):
    g = generator(seed, int(scale))
    batch, heads, per_rank, dim = (int(v) for v in torch.randint(1, 4, (4,), generator=g) + 1)
    q, k, v = (torch.randn(batch, heads, per_rank * world, dim, generator=g) for _ in range(3))
    return q * scale, k, v


def _checked(fn):
    """The learner's step, with its return value checked before the ring uses it: a wrong
    type or shape is said plainly, not as an unpacking error deep in the ring."""
    def step(acc, m, l, scores, v):
        # read before a step that works in place; the expected m only after it returns
        before, block_max = m.clone(), scores.amax(-1)
        shapes = [tuple(t.shape) for t in (acc, m, l)]
        out = fn(acc, m, l, scores, v)
        if (not isinstance(out, (tuple, list)) or len(out) != 3
                or not all(isinstance(t, torch.Tensor) for t in out)
                or [tuple(t.shape) for t in out] != shapes):
            raise TypeError(f"online_softmax_step must return (acc, m, l): three tensors of "
                            f"shapes {shapes}, got {_kind(out)}")
        want_m = torch.maximum(before, block_max)
        if not torch.equal(out[1], want_m):
            raise ValueError(_wrong_maximum(out[1], want_m, block_max))
        return out
    return step


def _wrong_maximum(got, want, block_max) -> str:
    """What a step's wrong m is, in words: a maximum is exact, so any other m is a mistake
    this says on every seed (not only where it happens to underflow or overflow)."""
    if not got.any():
        how = ", not 0: without it exp() of a score in the hundreds overflows"
    elif not got.ne(got.flatten()[0]).any() and want.ne(want.flatten()[0]).any():
        how = ", not one number for the whole block"
    elif torch.equal(got, block_max):
        how = ", not this block's maximum alone (the old m belongs in it)"
    else:
        how = ""
    return ("m must be the running maximum of each row: torch.maximum(m, scores.amax(-1)), "
            f"the old m and this block's largest score over the keys (the last dimension){how}. "
            "Subtract it before exp, and rescale the old acc and l by exp(m_old - m_new)")


def _kind(value) -> str:
    """A return value in one line: its type, and its tensors' shapes."""
    if isinstance(value, (tuple, list)):
        parts = [f"tensor of shape {tuple(v.shape)}" if isinstance(v, torch.Tensor)
                 else type(v).__name__ for v in value]
        return f"a {type(value).__name__} of {len(value)}: ({', '.join(parts)})"
    if isinstance(value, torch.Tensor):
        return f"one tensor of shape {tuple(value.shape)}"
    return type(value).__name__


def _trial(fn, dealt) -> list:
    """The scratch ring on this rank's q, k, v (dealt by the checker's process) with the
    learner's step in place of the reference's, which refuses however it is imported."""
    forward, results = _ring_forward_with(_checked(fn)), []
    with refused_everywhere(online_softmax_step, "scratch.ring_attention.online_softmax_step",
                            "write the step yourself"):
        for scale, causal, q, k, v in dealt.take():
            out, lse = forward(q, k, v, causal, None, "contiguous")
            results.append({"out": out, "lse": lse, "scale": scale, "causal": causal})
    return results


def _ring_forward_with(step):
    """The scratch ring's forward, calling ``step`` where it calls online_softmax_step: its
    code with a copy of its module's globals, so that the module stays as it is (the
    learner's function, unpickled in the rank, may import the step's name from it)."""
    forward = _ring()._forward
    return types.FunctionType(forward.__code__, {**forward.__globals__,
                                                 "online_softmax_step": step},
                              forward.__name__, forward.__defaults__, forward.__closure__)


def _dealt(seed: int, world: int):
    """Made here, in the checker's process: each rank gets its own slice of q, k and v (the
    ring brings it the others' k and v), for every trial; cloned, since a view would carry
    its whole storage, every rank's slice, into the rank."""
    trials = [(scale, causal, _problem(seed, world, scale)) for scale in SCALES
              for causal in (False, True)]
    return deal([[(scale, causal, *(t.chunk(world, dim=-2)[rank].clone() for t in qkv))
                  for scale, causal, qkv in trials] for rank in range(world)])


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
    if (lse == float("-inf")).any():
        return ("a row's sum l came out 0 (its m + log(l) is -inf), so acc / l is 0 / 0: "
                "exp(scores - m) underflowed because m was larger than every score of that "
                "row. m must be each row's own running maximum (amax over the keys, the last "
                "dimension), not one number for the whole block")
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

    def judge(trials: list, rank: int, n: int) -> str | None:
        for got in trials:
            problem = _problem_with(got, _expected(seed, n, got["scale"], got["causal"]), rank)
            if problem:
                kind = "causal" if got["causal"] else "full"
                return f", {kind} attention, scores x{got['scale']:g}: {problem}"
        return None

    each_world(_trial, lambda n: (fn, _dealt(seed, n)), judge, seed,
               hang_hint="The step computes on this rank only: no collective in it.")
    return (f"ring attention with your step equals attention over the whole sequence on 1 to 4 "
            f"ranks, causal and not, with scores that overflow exp() (seed {seed})")


EXERCISES = (
    Exercise(
        name="12.online_softmax", notebook="12_sequence_parallelism",
        summary="online_softmax_step(acc, m, l, scores, v): fold one block into the running "
                "numerator, maximum and sum",
        hint="Keep m the largest score seen so far in each row, and keep acc and l relative "
             "to it: exp(scores - m) never overflows. When m grows, whatever was accumulated "
             "relative to the old m has to be brought to the new one. Divide by l nowhere.",
        recipe="1. m_new = torch.maximum(m, scores.amax(dim=-1)) (each row's running "
               "maximum).\n2. p = torch.exp(scores - m_new.unsqueeze(-1)) (this block, "
               "relative to m_new; masked keys give exp(-inf) = 0).\n3. correction = "
               "torch.exp(m - m_new) (0 on the first block, where m = -inf).\n4. l_new = l * "
               "correction + p.sum(dim=-1); acc_new = acc * correction.unsqueeze(-1) + p @ v."
               "\n5. return acc_new, m_new, l_new.",
        solution=online_softmax_step, checker=check_online_softmax),
)
