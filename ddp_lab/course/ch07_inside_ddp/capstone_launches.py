"""The capstone's check of its collectives, one step on one rank: one all-reduce per bucket
(in the bucket's dtype, or float32 for a float16 bucket), in bucket order, issued during
backward where the bucket's gradients were ready then, and at most one small collective more
(the map of the parameters used). ``issued`` is what ``BackwardTrace`` saw: (family,
elements, dtype, in backward) per collective."""

from __future__ import annotations

from collections import Counter

from ddp_lab.exercises.registry import ExerciseFailed


def judge_launches(at: str, issued: list, buckets: list, unused: set) -> None:
    reduces = [call for call in issued if call[0] == "all_reduce"]
    expected = [(sum(numel for _, numel, _ in b), b[0][2]) for b in buckets]
    if not any(_fits(call, want) for call in reduces for want in expected):
        others = dict(Counter(call[0] for call in issued if call[0] != "all_reduce"))
        instead = (f"; the gradients went through {others} instead, which move more bytes "
                   "than one all-reduce per bucket (an all-gather: world times the bucket "
                   "into every rank)" if others else ": the gradients were never averaged")
        raise ExerciseFailed(f"{at}: no all-reduce was issued (in any form) on a bucket's "
                             f"gradients during backward and sync_gradients(){instead}")
    blocked = next(k for k, b in enumerate(buckets) if {name for name, _, _ in b} & unused)
    if blocked and not any(call[3] for call in reduces):
        raise ExerciseFailed(
            f"{at}: the first all-reduce was issued after backward had ended. Register a hook "
            "on each parameter that trains (param.register_post_accumulate_grad_hook) and "
            "launch the all-reduce there with async_op=True, so communication overlaps the "
            "rest of backward; sync_gradients() only waits.")
    matched, extras = [], []
    for call in issued:
        k = len(matched)
        fits = k < len(expected) and call[0] == "all_reduce" and _fits(call, expected[k])
        (matched if fits else extras).append(call)
    if len(matched) < len(expected):
        raise ExerciseFailed(f"{at}: {_order_problem(reduces, expected, buckets)}")
    limit = sum(len(b) for b in buckets) * 4  # a map of the parameters used, from each rank
    if len(extras) > 1 or any(call[1] > limit for call in extras):
        raise ExerciseFailed(
            f"{at}: besides one all-reduce per bucket, this step issued {extras} "
            "(family, elements, dtype, in backward). A bucket's all-reduce is the whole cost; "
            "at most one small collective more (a map of the parameters each rank used).")
    late = [k for k in range(blocked) if not matched[k][3]]
    if late:
        first = "the first all-reduce" if late[0] == 0 else f"bucket {late[0]}'s all-reduce"
        raise ExerciseFailed(
            f"{at}: {first} was issued after backward had ended, though its gradients and "
            "those of the buckets before it were all ready during backward. Launch each "
            "bucket from the hook of its last gradient "
            "(param.register_post_accumulate_grad_hook) with async_op=True, so "
            "communication overlaps the rest of backward; sync_gradients() only launches "
            "buckets held back by a parameter that got no gradient, then waits.")


# A float16 (bfloat16) bucket may be summed in float32, a wider dtype: the same average, no
# overflow, twice the bytes of that bucket. torch sums it in its own dtype.
WIDER = {"float16": "float32", "bfloat16": "float32"}


def _fits(call: tuple, want: tuple) -> bool:
    """Whether an all-reduce ``call`` (family, elements, dtype, ...) is bucket ``want``'s
    (elements, dtype): the same elements, in the bucket's dtype or a wider one."""
    numel, dtype = call[1:3]
    return numel == want[0] and dtype in (want[1], WIDER.get(want[1]))


def _order_problem(reduces: list, expected: list, buckets: list) -> str:
    got = [next((want for want in expected if _fits(call, want)), tuple(call[1:3]))
           for call in reduces]
    what = ("one per parameter" if all(len(b) == 1 for b in buckets) else
            "one per bucket: parameters in reverse order, one dtype per bucket, a bucket "
            "closed once it holds bucket_mb MiB or more")
    shown = (f"(elements, dtype) issued: {[tuple(call[1:3]) for call in reduces]}; expected, "
             f"in this order: {expected}")
    if not Counter(expected) - Counter(got):
        return (f"the all-reduces came in another order than the buckets'. {shown}. Launch "
                "bucket k only after buckets 0..k-1, even when a parameter got no gradient on "
                "this rank: the ranks pair their all-reduces by order, so theirs must match.")
    alone = [want for want in expected if want[1] in WIDER]
    if alone and not set(alone) & set(got):
        return (f"no all-reduce carried the float16 bucket (the gain's {alone[0][0]} "
                f"elements) on its own: the gain shared a bucket with float32 gradients "
                f"(torch.cat promotes them silently). torch keeps one dtype per bucket. "
                f"{shown}")
    fewer = ("; a bucket whose parameters got no gradient on this rank is all-reduced all the "
             "same (zeros for them), in its turn: another rank may have used them"
             if len(got) < len(expected) else "")
    return (f"{len(got)} all-reduces in this step, expected {len(expected)} ({what}{fewer}). "
            f"{shown}")
