"""Notebook 00b's exercise: do all ranks hold the same weights? The same answer on every rank.

Live ranks step a model cell by cell, and the one invariant of data parallelism is that
every rank's weights stay identical: bit for bit, so a weight that is NaN on every rank
agrees (a run that blew up is still in sync) and +0.0 against -0.0 does not (== calls them
equal; their sign bits differ). The check builds the same model on every rank (one seed),
with a frozen layer (``requires_grad=False``: still a weight every rank must agree on), then
on every world size but 1 runs one trial where the weights agree and one where one rank (a
random one: either on 2 ranks, rank 1 or 2 on 3, rank 2 or 3 on 4, a middle one on 3 or 4,
so comparing two ranks alone fails) differs in one of three ways, spread so that every check
meets all three: a weight of the frozen layer one float32 step up (the next representable number), a
trainable weight one step up, or two different weights of one tensor swapped.
A float32 sum or mean of the weights can round the step away and a tolerance forgives it; a
sum, a norm, a sorted copy or any checksum that ignores positions cannot see the swap;
skipping frozen weights misses the first. Last, on one world size, the weights hold a NaN
and a zero: once the same bits everywhere (agree), once with the zero negated on one rank
(disagree); a comparison of float values gets both wrong. An answer that only one rank
knows, or that differs between ranks, fails. The weights must come back untouched.

The checker makes every rank's weights and hands each rank only its own
(:func:`~ddp_lab.exercises.sealed.deal`): which rank differs, and how, is known only in the
checker's process, where the verdicts are judged. Ranks forked from one server share
Python's per-process salt for ``hash()`` of bytes and str; the check gives each rank its
own, as ranks started apart have, so a fingerprint by ``hash()`` fails as it would there.
"""

from __future__ import annotations

import builtins

import torch
import torch.distributed as dist

from ddp_lab.exercises.builtins_off import replaced
from ddp_lab.exercises.driver import WORLD_SIZES, each_world, generator, new_seed
from ddp_lab.exercises.driver import where as on
from ddp_lab.exercises.registry import Exercise, ExerciseFailed
from ddp_lab.exercises.sealed import deal

DIFFERENCES = ("frozen", "trainable", "swap")
BITS = ("nan", "zero")  # the last trials: a NaN and a zero in the weights (same bits, -0.0)


def weights_agree(model: torch.nn.Module) -> bool:
    """Reference: every parameter's bytes in one uint8 vector v (any dtype, no copy wider
    than the weights); one all_reduce(MAX) of [v, ~v] gives each byte's largest and
    (bitwise-negated) smallest value over the ranks, since ~ reverses the order of uint8
    values. They are equal exactly when every rank holds the same bits (a NaN agrees with
    the same NaN, -0.0 differs from +0.0), and every rank reads the same reduced tensor."""
    v = torch.cat([p.detach().reshape(-1).view(torch.uint8) for p in model.parameters()])
    both = torch.cat([v, ~v])
    dist.all_reduce(both, op=dist.ReduceOp.MAX)
    return torch.equal(both[:v.numel()], ~both[v.numel():])


def _model(seed: int, bits: bool = False) -> torch.nn.Module:
    """The same weights on every rank; sizes only the check's seed decides. The last layer is
    frozen, as a fine-tuned model's embedding or a pretrained backbone would be. Weights are
    odd multiples of 1/512: every sum of them or of their squares (under 100 weights) is then
    exact in float32, in any order, so a norm or a checksum never sees a swap by rounding (a
    gate run drew a seed where a norm's summation order did); and none is 0, whose next
    float32 step is too small for any sum to see. With ``bits``, the first weight is NaN and
    the second 0.0 on every rank."""
    sizes = torch.randint(2, 6, (4,), generator=generator(seed)).tolist()
    with torch.random.fork_rng(devices=[]):  # the caller's own random state stays as it was
        torch.manual_seed(seed)
        model = torch.nn.Sequential(torch.nn.Linear(sizes[0], sizes[1]), torch.nn.Tanh(),
                                    torch.nn.Linear(sizes[1], sizes[2]), torch.nn.Tanh(),
                                    torch.nn.Linear(sizes[2], sizes[3]))
    model[4].requires_grad_(False)
    with torch.no_grad():
        for param in model.parameters():
            param.copy_((torch.floor(param * 256) + 0.5) / 256)
        if bits:
            model[0].weight.view(-1)[:2] = torch.tensor([float("nan"), 0.0])
    return model


def _differ(model: torch.nn.Module, seed: int, how: str) -> str:
    """Make this rank's weights differ from the others' in the smallest way of kind ``how``;
    return where, in words. A swap picks among the trainable tensors that hold two different
    values: a 2-element bias can round to one value twice, and swapping its elements would
    change nothing (review IP-00b-1). The first layer's weight (at least 4 values) leaves the
    list empty only if all its values coincide, and the other tensors' too."""
    params = [(name, p) for name, p in model.named_parameters()
              if (how == "frozen") == (not p.requires_grad)
              and (how != "swap" or bool((p.data != p.data.view(-1)[0]).any()))]
    if not params:
        raise RuntimeError(f"checker bug: seed {seed} drew a model whose trainable tensors each "
                           "hold one value, so no swap can change it; please report this seed.")
    pick = torch.randint(0, 10 ** 6, (3,), generator=generator(seed, 7)).tolist()
    name, param = params[pick[0] % len(params)]
    flat = param.data.view(-1)
    i = pick[1] % flat.numel()
    if how == "swap":
        j = next(j for j in range(flat.numel()) if flat[j] != flat[i])
        flat[i], flat[j] = flat[j].clone(), flat[i].clone()
        return f"{name}[{i}] and {name}[{j}] were swapped"
    flat[i] = torch.nextafter(flat[i], torch.tensor(float("inf")))
    frozen = " (a frozen weight, requires_grad=False)" if how == "frozen" else ""
    return f"{name}[{i}]{frozen} was one float32 step above the others'"


def _bits_differ(model: torch.nn.Module) -> str:
    """The NaN and zero trials: on the odd rank the zero becomes -0.0."""
    model[0].weight.data.view(-1)[1] = -0.0
    return "0.weight[1] was -0.0 where the others hold +0.0 (0.weight[0] is NaN on every rank)"


def _bytes(t: torch.Tensor) -> torch.Tensor:
    """Bits, not values: NaN weights are kept when their bits are."""
    return t.detach().reshape(-1).view(torch.uint8)


def rank_weights(seed: int, n: int, odd_rank: int | None, how: str) -> tuple[list, str]:
    """Every rank's weights (a list of tensors each), made here, and what makes the odd
    rank's differ, in words ("" when all agree)."""
    weights, differs = [], ""
    for rank in range(n):
        model = _model(seed, bits=how in BITS)
        if rank == odd_rank:
            differs = _bits_differ(model) if how in BITS else _differ(model, seed, how)
        weights.append([p.detach().clone() for p in model.parameters()])
    return weights, differs


def _rebuilt(weights: list) -> torch.nn.Module:
    """This rank's model, from its weights alone: the architecture of :func:`_model`."""
    shapes = [w.shape for w in weights[::2]]
    layers = [torch.nn.Linear(shape[1], shape[0]) for shape in shapes]
    model = torch.nn.Sequential(layers[0], torch.nn.Tanh(), layers[1], torch.nn.Tanh(), layers[2])
    with torch.no_grad():
        for param, weight in zip(model.parameters(), weights):
            param.copy_(weight)
    model[4].requires_grad_(False)
    return model


def salted_hash(salt: int, calls: list):
    """``hash`` as a rank started on its own would have it: the hash of a str or bytes is
    salted per process (PYTHONHASHSEED), so ranks that torchrun or another machine started
    hash the same bytes differently. Ranks forked from one server share the salt; this gives
    each its own, and notes each salted call in ``calls``."""
    plain = builtins.hash

    def hash(obj):  # noqa: A001 - it stands in for the built-in
        value = plain(obj)
        if _salted(obj):
            calls.append(type(obj).__name__)
            return plain((salt, value))
        return value
    return hash


def _salted(obj) -> bool:
    if isinstance(obj, (str, bytes, memoryview)):
        return True
    return isinstance(obj, (tuple, frozenset)) and any(_salted(x) for x in obj)


def _trial(fn, dealt, salt: int):
    """The learner's verdict on this rank's weights (the only ones it sees), whether they
    came back untouched, and whether it hashed bytes or str."""
    model = _rebuilt(dealt.take())
    before = [_bytes(p).clone() for p in model.parameters()]
    hashed: list = []
    with replaced(builtins, "hash", salted_hash(salt + dist.get_rank(), hashed)):
        got = fn(model)
    kept = all(torch.equal(a, _bytes(p)) for a, p in zip(before, model.parameters()))
    return got, kept, bool(hashed)


def odd_ranks(seed: int) -> dict[int, int]:
    """The rank that differs, per world size: on 2 ranks either (rank 0 included), on 3 rank
    1 or 2, on 4 rank 2 or 3, and one of them a middle rank: an answer that compares ranks 0
    and 1 alone, or the first and the last rank alone, misses one every time."""
    draw = {n: int(torch.randint(0, n, (1,), generator=generator(seed, n))) for n in WORLD_SIZES}
    on_3 = 1 + draw[3] % 2
    return {**draw, 3: on_3, 4: 2 if on_3 == 2 else 2 + draw[4] % 2}


def _one_trial(fn, seed: int, n: int, odd: int | None, how: str) -> None:
    weights, differs = rank_weights(seed, n, odd, how)
    salt = int(torch.randint(1, 2 ** 30, (1,), generator=generator(seed, n, 5)))
    each_world(_trial, (fn, deal(weights), salt), seed=seed, sizes=(n,),
               judge_world=lambda results, n: _judge(results, odd, differs, on(n, seed), how))


def check_weights_agree(fn) -> str:
    seed = new_seed()
    order = torch.randperm(len(DIFFERENCES), generator=generator(seed, 1)).tolist()
    odd_rank = odd_ranks(seed)
    for n in WORLD_SIZES:
        how = DIFFERENCES[order[(n - 2) % len(DIFFERENCES)]]
        for odd in [None] + ([odd_rank[n]] if n > 1 else []):
            _one_trial(fn, seed, n, odd, how)
    n = WORLD_SIZES[1:][seed % (len(WORLD_SIZES) - 1)]
    odd = int(torch.randint(0, n, (1,), generator=generator(seed, n, 2)))
    for odd, how in ((None, "nan"), (odd, "zero")):
        _one_trial(fn, seed, n, odd, how)
    return (f"the same verdict on every rank, on 1-4 ranks, with one rank a float32 step "
            f"off (in a frozen and in a trainable layer), two weights swapped, or -0.0 for "
            f"+0.0, and a NaN on every rank agreeing with itself (seed {seed})")


def _judge(results: list, odd_rank: int | None, differs: str, where: str, how: str) -> None:
    expected = odd_rank is None
    held = "every rank held the same weights" if expected else f"rank {odd_rank}'s {differs}"
    if expected and how == "nan":
        held += ", bit for bit, 0.weight[0] NaN on every rank"
    for rank, (got, kept, _) in enumerate(results):
        if not kept:
            raise ExerciseFailed(f"{where}: rank {rank}'s weights changed during your function: "
                                 "collectives work in place, so reduce a copy (a new tensor), "
                                 "never the parameters themselves.")
        if not isinstance(got, bool):
            raise ExerciseFailed(f"{where}: rank {rank} returned {type(got).__name__} "
                                 f"{got!r}; return a bool (bool(...) of a tensor comparison).")
    answers = [got for got, _, _ in results]
    hashed = any(used for _, _, used in results)
    if len(set(answers)) > 1:
        raise ExerciseFailed(f"{where}: {held}, and the ranks answered {answers}: every rank "
                             "must give the same answer, so each needs what all the others hold.")
    if answers[0] != expected:
        raise ExerciseFailed(f"{where}: {held}, yet every rank answered {answers[0]}. "
                             f"{_why_missed(held, hashed and expected)}")


def _why_missed(held: str, hashed: bool = False) -> str:
    if hashed:
        return ("Your function called hash() on bytes or a str: Python salts those hashes per "
                "process (PYTHONHASHSEED), so ranks started apart (torchrun, other machines) "
                "hash the same bytes differently, and this check gives each rank its own salt. "
                "Compare the bytes themselves, or a digest that depends on them alone "
                "(hashlib).")
    if "NaN on every rank" in held and "-0.0" not in held:
        return ("NaN == NaN is False for floats, yet the bits agree: compare the bits "
                "(a tensor's .view(torch.uint8) or .view(torch.int32)), not the values.")
    if "-0.0" in held:
        return ("-0.0 == +0.0 is True for floats, yet the sign bits differ: compare the bits "
                "(a tensor's .view(torch.uint8) or .view(torch.int32)), not the values.")
    if "swapped" in held:
        return ("A sum, a norm, a checksum or a sorted copy is the same after a swap: "
                "compare every weight with the same weight on the other ranks.")
    if "frozen" in held:
        return ("Frozen weights (requires_grad=False) are weights too: model.parameters() "
                "yields them all; compare every one.")
    return "A sum, a mean or a tolerance can hide a difference of one float32 step: compare " \
           "exactly."


EXERCISES = (
    Exercise(
        name="00b.weights_agree",
        notebook="00b_live_ranks",
        summary="weights_agree(model): True on every rank exactly when all ranks hold the "
                "same weights",
        hint="each rank needs to know, for every single weight, whether the others hold the "
             "same bits: one collective can tell every rank each byte's largest and smallest "
             "value over the ranks (for a uint8 x, what is the largest of ~x?).",
        recipe="v = torch.cat of every parameter's bytes, detached, flattened and viewed as "
               "uint8 (p.detach().reshape(-1).view(torch.uint8), frozen ones too); "
               "both = torch.cat([v, ~v]); dist.all_reduce(both, op=dist.ReduceOp.MAX) gives "
               "each byte's maximum and ~ its minimum over the ranks; return "
               "torch.equal(both[:len(v)], ~both[len(v):]), the same bool on every rank. "
               "Reduce the copy, never the parameters.",
        solution=weights_agree,
        checker=check_weights_agree,
    ),
)
