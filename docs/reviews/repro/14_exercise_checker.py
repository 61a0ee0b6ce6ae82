"""Notebook 14 review: ex.check('14.fsdp_cost') on three wrong answers of the reviewer's own
and one right answer written differently. Run with the commit's ddp_lab on PYTHONPATH."""
import math

import ddp_lab.exercises as ex


def right_other_way(layers, world_size, alpha, beta):
    n = world_size
    padded = lambda k: math.ceil(k / n) * n  # noqa: E731
    tensors = []
    for i, (a, b) in enumerate(layers):
        tensors += [a * b, b, a * b, b] + ([a * b] if i else [])
    return len(tensors) * alpha + beta * 4 * (n - 1) / n * sum(map(padded, tensors))


def bias_gathered_again(layers, world_size, alpha, beta):      # wrong: bias re-gathered in backward
    n = world_size
    t = [x for i, (a, b) in enumerate(layers) for x in [a * b, b, a * b, b] + ([a * b, b] if i else [])]
    return sum(alpha + beta * 4 * (n - 1) / n * (k + (-k) % n) for k in t)


def bf16_bytes(layers, world_size, alpha, beta):               # wrong: 2 bytes per element
    return right_other_way(layers, world_size, alpha, beta / 2)


def no_comm_on_one_rank(layers, world_size, alpha, beta):      # one rank: "nothing to send"
    return 0.0 if world_size == 1 else right_other_way(layers, world_size, alpha, beta)


for fn in (right_other_way, bias_gathered_again, bf16_bytes, no_comm_on_one_rank):
    print("====", fn.__name__)
    try:
        ex.check("14.fsdp_cost", fn)
    except Exception as e:  # ExerciseFailed
        print(type(e).__name__, str(e)[:900])
