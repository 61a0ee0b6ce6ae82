"""Notebook 11's exercise: the row-parallel linear layer's forward and backward.

Each rank holds a slice of the input's features and the matching columns of the weight; the
full output is the sum of the ranks' partial products plus the bias, on every rank, and the
gradients must reach each rank's slices. The check makes the inputs in its own process and
deals each rank only its slices (and the bias and the output's gradient), then runs the
learner's function on 1 to 4 ranks with random sizes, the row-parallel layers of torch and of ``ddp_lab.scratch``
switched off (on their classes, which every imported name shares), runs the backward and
compares the output and every gradient with one unsharded Linear, and that every rank holds the same output bit for bit (a replicated
tensor: the layers after it, and the gradients of replicated parameters, must not drift
apart across ranks; 16-40 rows, so that a value rebuilt from each rank's own partial product
shows its rounding). Then what the text asks
of the layer: one all-reduce's worth of bytes in forward (no more from a rank; no less than
the other ranks' partial products, over all ranks) and nothing in backward (counted by
CollectiveTrace, however the collective is reached), and no collective run in place on a
tensor of autograd's graph: autograd cannot see ``c10d::allreduce_`` (it has no autograd
kernel), so its backward only works through torch's deprecated fallback, which warns
"an autograd kernel was not registered to the Autograd key(s)"
(torch/csrc/autograd/autograd_not_implemented_fallback.cpp; the default fallback mode,
``torch._C._get_autograd_fallback_mode()``, is "warn" in torch 2.13).
"""

from __future__ import annotations

import contextlib
import warnings

import torch
import torch.distributed as dist

from ddp_lab import scratch
from ddp_lab.course.collective_trace import CollectiveTrace
from ddp_lab.exercises.builtins_off import refusing, replaced
from ddp_lab.exercises.driver import each_world, generator, new_seed
from ddp_lab.exercises.registry import Exercise
from ddp_lab.exercises.sealed import deal

COST_TOLERANCE = 1.25  # the reference's forward moves exactly one all-reduce of the output
FALLBACK_WARNING = "an autograd kernel was not registered"


def row_parallel_linear(x_slice, weight_slice, bias):
    """Reference: all-reduce the partial product in forward, and let the gradient through
    unchanged in backward (every rank's output gradient is already the full one). The value
    is ``total`` bit for bit (``partial - partial.detach()`` is exactly zero), so every rank
    holds the same output; ``partial + (total - partial).detach()`` has the same gradient,
    but each rank rounds ``p + (t - p)`` with its own ``p``, and the "replicated" outputs
    differ in their last bits from rank to rank."""
    partial = x_slice @ weight_slice.T
    total = partial.detach().clone()
    dist.all_reduce(total)
    return total + (partial - partial.detach()) + bias  # value: the sum; gradient: identity


def _problem_inputs(seed: int, world: int):
    """Random sizes; fewer output features than input ones (as in a real MLP's second
    layer), so that gathering the inputs or the partial products costs more than the
    all-reduce of the output."""
    g = generator(seed)
    batch, per_rank = (int(v) for v in torch.randint(2, 6, (2,), generator=g))
    batch, per_rank, out = batch * 8, per_rank + 1, int(torch.randint(2, 5, (1,), generator=g))
    x = torch.randn(batch, per_rank * world, generator=g)
    weight = torch.randn(out, per_rank * world, generator=g)
    bias = torch.randn(out, generator=g)
    upstream = torch.randn(batch, out, generator=g)  # d loss / d output
    return x, weight, bias, upstream


def _dealt(seed: int, world: int):
    """Made here, in the checker's process: each rank gets its slice of the input's features,
    the matching columns of the weight, the bias and the output's gradient, nothing else."""
    x, weight, bias, upstream = _problem_inputs(seed, world)
    return deal([(xs.clone(), ws.clone(), bias, upstream) for xs, ws in
                 zip(x.chunk(world, dim=1), weight.chunk(world, dim=1))])


def _row_trial(fn, dealt) -> dict:
    x_slice, w_slice, b, upstream = (t.requires_grad_(i < 3) for i, t in
                                     enumerate(dealt.take()))
    with _no_row_parallel_layers(), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with CollectiveTrace() as forward:
            out = fn(x_slice, w_slice, b)
        with CollectiveTrace() as backward:
            if isinstance(out, torch.Tensor) and out.requires_grad:
                (out * upstream).sum().backward()
    return {"out": out.detach() if isinstance(out, torch.Tensor) else out,
            "x_grad": x_slice.grad, "w_grad": w_slice.grad, "b_grad": b.grad,
            "forward": _sent(forward), "backward": _sent(backward),
            "bypassed": sorted({str(w.message).split(": ")[0] for w in caught
                                if FALLBACK_WARNING in str(w.message)})}


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def _sent(trace: CollectiveTrace) -> tuple[float, dict]:
    """Bytes this rank sent (a ring's share, list forms counted whole), and the families."""
    sent = sum(c.bytes_per_rank * c.whole_nbytes / c.nbytes
               for c in trace.moving_data() if c.nbytes)
    return sent, trace.family_counts()


def _no_row_parallel_layers() -> contextlib.ExitStack:
    """torch's RowwiseParallel, the scratch layer and its autograd function *g* refuse,
    patched on their classes, so that a name imported at the top of a notebook refuses too."""
    from torch.distributed.tensor.parallel import RowwiseParallel
    why = "write the row-parallel layer yourself from x_slice @ weight_slice.T and an all-reduce"
    stack = contextlib.ExitStack()
    for cls, name, label in ((scratch.RowParallelLinear, "forward", "scratch.RowParallelLinear"),
                             (RowwiseParallel, "__init__", "RowwiseParallel")):
        stack.enter_context(replaced(cls, name, refusing(label, why)))
    g = scratch.tensor_parallel._ReduceFromParallel
    stack.enter_context(replaced(g, "forward", staticmethod(refusing(
        "scratch.tensor_parallel._ReduceFromParallel", why))))
    return stack


def _expected(seed: int, world: int) -> dict:
    x, weight, bias, upstream = _problem_inputs(seed, world)
    x, weight, bias = (t.requires_grad_() for t in (x, weight, bias))
    out = x @ weight.T + bias
    (out * upstream).sum().backward()
    return {"out": out.detach(), "x_grads": x.grad.chunk(world, dim=1),
            "w_grads": weight.grad.chunk(world, dim=1), "b_grad": bias.grad, "bias": bias.detach(),
            "partials": [xs @ ws.T for xs, ws in zip(x.detach().chunk(world, dim=1),
                                                    weight.detach().chunk(world, dim=1))]}


def _close(a, b) -> bool:
    return (isinstance(a, torch.Tensor) and a.shape == b.shape
            and torch.allclose(a, b, rtol=1e-4, atol=1e-5))


def _forward_problem(got, want: dict, rank: int, n: int) -> str | None:
    if _close(got, want["out"]):
        return None
    if _close(got, want["partials"][rank] + want["bias"]):
        return "the output is only this rank's partial product: all-reduce (sum) it over the ranks"
    if _close(got, want["out"] + (n - 1) * want["bias"]):
        return f"the bias was added {n} times: add it once, after the all-reduce"
    if _close(got, (want["out"] - want["bias"]) / n + want["bias"]):
        return "the partial products were averaged: the layer's output is their sum"
    shape = tuple(got.shape) if isinstance(got, torch.Tensor) else type(got).__name__
    return f"the output should be x @ W.T + b of shape {tuple(want['out'].shape)}, got {shape}"


def _same_output_problem(values: list, n: int, seed: int) -> str | None:
    """Every rank's output right (within rounding) but not the same bits on every rank: the
    value was rebuilt from this rank's own partial product, e.g. p + (t - p).detach(). Or
    right everywhere while the ranks' forwards sent less than the partial products need."""
    want = _expected(seed, n)
    outs = [v["out"] for v in values]
    if n == 1 or any(_forward_problem(out, want, rank, n) for rank, out in enumerate(outs)):
        return None                       # the per-rank judge explains what is wrong
    sent, least = sum(v["forward"][0] for v in values), (n - 1) * _nbytes(want["out"])
    if sent < 0.99 * least:
        return (f": the right output, but the ranks' forwards sent only {sent:.0f} bytes in "
                f"all ({values[0]['forward'][1] or 'no collective'} on rank 0), where every "
                f"other rank's partial product must reach each rank ({least:.0f} or more): "
                "sum them with a collective called from your function")
    differ = [rank for rank, out in enumerate(outs) if not torch.equal(out, outs[0])]
    if not differ:
        return None
    count = max(int((outs[rank] != outs[0]).sum()) for rank in differ)
    return (f": the output is not the same on every rank (rank {differ[0]} differs from rank 0 "
            f"in {count} of {outs[0].numel()} values, in the last bits): a replicated output "
            "must be identical, or the layers after it and the gradients of replicated "
            "parameters drift apart across ranks. Floating point does not undo a rounding: "
            "partial + (total - partial) is not total. Return the all-reduced sum itself "
            "(total + (partial - partial.detach()) keeps the gradient path, or an "
            "autograd.Function)")


def _backward_problem(got: dict, want: dict, rank: int, n: int) -> str | None:
    for name, mine, expected in (("x_slice", got["x_grad"], want["x_grads"][rank]),
                                 ("weight_slice", got["w_grad"], want["w_grads"][rank]),
                                 ("bias", got["b_grad"], want["b_grad"])):
        if mine is None:
            return (f"no gradient reached {name}: the output must stay connected to the "
                    "partial product x_slice @ weight_slice.T in autograd's graph (a custom "
                    "autograd.Function, or total + (partial - partial.detach())), not be a "
                    "detached copy")
        if _close(mine, expected):
            continue
        if n > 1 and _close(mine, expected * n):
            return (f"the gradient of {name} is {n}x too large: in backward every rank already "
                    "has the full output gradient, so the all-reduce's backward is the identity "
                    "(torch.distributed.nn's all_reduce, and the functional all_reduce, "
                    "whose backward is an all-reduce, sum the gradients again)")
        return f"the gradient of {name} differs from the unsharded Linear's"
    return None


def _graph_problem(got: dict) -> str | None:
    if got["bypassed"]:
        return (f"{', '.join(got['bypassed'])} ran in place on a tensor that autograd "
                "tracks (torch warned that it has no autograd kernel): autograd cannot see "
                "a c10d collective, so the gradient is right only through a deprecated "
                "fallback that torch will remove, and by luck. All-reduce a detached copy "
                "and connect the sum to the graph yourself, or wrap the all-reduce in an "
                "autograd.Function whose backward you write")
    return None


def _cost_problem(got: dict, want: dict, n: int) -> str | None:
    """Forward: at most one all-reduce of the output (2 (n-1)/n of its bytes per rank);
    backward: nothing, every rank already holds the whole output gradient."""
    sent, made = got["backward"]
    if sent > 0:
        return (f"the backward made collectives ({made}, {sent:.0f} bytes from this rank): "
                "the row-parallel layer's backward needs none, since every rank already "
                "holds the whole output gradient and its slices' gradients follow locally")
    sent, made = got["forward"]
    budget = 2 * (n - 1) / n * _nbytes(want["out"])
    if sent > COST_TOLERANCE * budget:
        return (f"the forward sent {sent:.0f} bytes from this rank ({made}); one all-reduce "
                f"of the output sends {budget:.0f}: the ranks need only the sum of their "
                "partial products, not each other's inputs, weights or partial products")
    return None


def check_row_parallel(fn) -> str:
    seed = new_seed()

    def judge(got: dict, rank: int, n: int) -> str | None:
        want = _expected(seed, n)
        return (_forward_problem(got["out"], want, rank, n)
                or _backward_problem(got, want, rank, n)
                or (_graph_problem(got) or _cost_problem(got, want, n) if n > 1 else None))

    each_world(_row_trial, lambda n: (fn, _dealt(seed, n)), judge, seed,
               judge_world=lambda values, n: _same_output_problem(values, n, seed),
               hang_hint="Every rank must make the same all-reduce.")
    return (f"output and every gradient equal an unsharded Linear on 1 to 4 ranks, the same "
            f"output bits on every rank, one all-reduce's bytes in forward, none in backward "
            f"(seed {seed})")


EXERCISES = (
    Exercise(
        name="11.row_parallel", notebook="11_device_meshes",
        summary="row_parallel_linear(x_slice, weight_slice, bias): full output, gradients to the slices",
        hint="Each rank's x_slice @ weight_slice.T is one term of x @ W.T; the ranks need "
             "their sum, and the bias once. For the backward, ask what gradient the sum "
             "should pass to each term, and keep autograd's graph connected: autograd does "
             "not see a collective run on a tensor it tracks.",
        recipe="1. partial = x_slice @ weight_slice.T (autograd tracks it).\n2. total = "
               "partial.detach().clone(); dist.all_reduce(total): the sum, outside the "
               "graph.\n3. out = total + (partial - partial.detach()): its value is "
               "exactly the sum (partial - partial.detach() is zero), its gradient reaches "
               "partial unchanged (the identity: every rank already has the whole output "
               "gradient). Not partial + (total - partial).detach(): the same gradient, but "
               "each rank rounds p + (t - p) with its own p, so the outputs differ in their "
               "last bits from rank to rank.\n4. return out + bias (once, after the "
               "sum). A torch.autograd.Function with the all-reduce in forward and "
               "`return grad` in backward does the same.",
        solution=row_parallel_linear, checker=check_row_parallel,
        answered_by=("ddp_lab.scratch.tensor_parallel:_ReduceFromParallel",
                     "ddp_lab.scratch.tensor_parallel:RowParallelLinear.forward")),
)
