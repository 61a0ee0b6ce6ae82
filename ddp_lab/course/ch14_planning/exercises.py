"""Notebook 14's exercise: one plan's cost function, FSDP's communication time per step.

``fsdp_comm_seconds(layers, world_size, alpha, beta)``: the seconds one training step of
``scratch.FSDP`` spends in collectives on each rank, for an MLP whose Linear layers (with
biases) have the shapes ``layers`` = [(fan_in, fan_out), ...], every collective costing
alpha + beta x (bytes this rank sends with a ring: (n-1)/n of the full, padded tensor).

The checker draws the layers (uneven sizes: padding matters), alpha and beta in its own
process from a fresh seed and deals them to 1 to 4 ranks; each rank trains one real step of
``scratch.FSDP`` on that MLP under a ``CollectiveTrace`` and calls the learner's function.
The checker's process sums alpha + beta x bytes over the traced collectives and compares:
the answer is judged against what ran, not against a formula of ours. The usual mistakes
(no all-gather in backward, the first layer's weight gathered again, N in place of N - 1,
no padding, a reduce-scatter priced as an all-reduce, the biases forgotten) are recognised
and named.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn as nn

from ddp_lab import scratch
from ddp_lab.course.collective_trace import CollectiveTrace
from ddp_lab.exercises.driver import each_world, generator, new_seed, number_problem
from ddp_lab.exercises.registry import Exercise
from ddp_lab.exercises.sealed import deal

TOLERANCE = 1e-9
SHARDING = ("all_gather", "reduce_scatter")


def fsdp_comm_seconds(layers, world_size, alpha, beta):
    """Reference: per layer, all-gather the weight and the bias in forward, the weight again
    in backward (not the first layer's: its input needs no gradient, so autograd keeps no
    weight for it), reduce-scatter both gradients; each tensor padded to a multiple of the
    world size, fp32, and this rank sends (n-1)/n of it."""
    n = world_size

    def wire_bytes(numel):
        padded = numel + (-numel) % n
        return padded * 4 * (n - 1) / n

    total = 0.0
    for k, (fan_in, fan_out) in enumerate(layers):
        weight, bias = fan_in * fan_out, fan_out
        gathered = [weight, bias] + ([weight] if k > 0 else [])
        for numel in gathered + [weight, bias]:
            total += alpha + beta * wire_bytes(numel)
    return total


def problem_inputs(seed: int, world: int) -> dict:
    """Layer shapes (3 to 5 layers of 3 to 40 features), alpha (0.1 to 5 ms), beta (1 to 100
    ns per byte) and the rows of each rank's batch, made in the checker's process."""
    g = generator(seed, world)
    depth = int(torch.randint(3, 6, (1,), generator=g))
    sizes = torch.randint(3, 41, (depth + 1,), generator=g).tolist()
    return {"layers": list(zip(sizes[:-1], sizes[1:])),
            "alpha": round(float(torch.empty(1).uniform_(1e-4, 5e-3, generator=g)), 6),
            "beta": round(float(torch.empty(1).uniform_(1e-9, 1e-7, generator=g)), 12),
            "rows": int(torch.randint(2, 7, (1,), generator=g)), "seed": seed}


def _mlp(layers) -> nn.Sequential:
    modules = []
    for k, (fan_in, fan_out) in enumerate(layers):
        modules.append(nn.Linear(fan_in, fan_out))
        if k < len(layers) - 1:
            modules.append(nn.ReLU())
    return nn.Sequential(*modules)


def _trial(fn, dealt) -> dict:
    """One real step of scratch.FSDP, traced; then the learner's prediction."""
    given = dealt.take()
    torch.manual_seed(given["seed"])
    model = scratch.FSDP(_mlp(given["layers"]))
    x = torch.randn(given["rows"], given["layers"][0][0])
    with CollectiveTrace(dist.get_world_size()) as trace:
        model(x).pow(2).mean().backward()
        model.sync_gradients()
    calls = [(c.family, c.nbytes, c.bytes_per_rank) for c in trace.calls if c.family in SHARDING]
    got = fn(list(given["layers"]), dist.get_world_size(), given["alpha"], given["beta"])
    return {"got": got, "calls": calls}


def traced_seconds(calls, alpha: float, beta: float) -> float:
    """What the traced step's collectives cost: alpha + beta x bytes sent, each."""
    return sum(alpha + beta * sent for _, _, sent in calls)


def _variant(layers, n, alpha, beta, *, backward="all_but_first", pad=True, share=None,
             biases=True) -> float:
    """The reference's arithmetic with one mistake (the checker's diagnosis)."""
    total = 0.0
    for k, (fan_in, fan_out) in enumerate(layers):
        weight, bias = fan_in * fan_out, fan_out
        again = {"all_but_first": k > 0, "none": False, "all": True}[backward]
        tensors = [("g", weight), ("s", weight)] + ([("g", weight)] if again else [])
        tensors += [("g", bias), ("s", bias)] if biases else []
        for kind, numel in tensors:
            padded = numel + (-numel) % n if pad else numel
            fraction = (share or {}).get(kind, (n - 1) / n)
            total += alpha + beta * padded * 4 * fraction
    return total


MISTAKES = (
    ({"backward": "none"}, "no all-gather in backward: scratch.FSDP drops each full weight "
     "after its forward, so backward all-gathers it again (every layer but the first)"),
    ({"backward": "all"}, "the first layer's weight is not all-gathered again in backward: "
     "its input needs no gradient, and a Linear keeps its weight only to compute the input's "
     "gradient (the trace above shows layers - 1 backward all-gathers)"),
    ({"share": {"g": 1.0, "s": 1.0}}, "each rank sends (n-1)/n of a full tensor in a ring "
     "all-gather or reduce-scatter (it already holds its own 1/n), not all of it: N - 1, not N"),
    ({"pad": False}, "every tensor is padded to a multiple of world_size before it is sharded "
     "(scratch.fsdp.padded_flat): count the padded size"),
    ({"share": {"s": None}}, "a reduce-scatter sends (n-1)/n of the tensor, half of an "
     "all-reduce's 2(n-1)/n"),
    ({"biases": False}, "the biases are parameters too: each is all-gathered in forward and "
     "its gradient reduce-scattered"),
)


def _diagnosis(got: float, given: dict, n: int) -> str | None:
    for mistake, said in MISTAKES:
        options = dict(mistake)
        if options.get("share") == {"s": None}:
            options["share"] = {"s": 2 * (n - 1) / n}
        wrong = _variant(given["layers"], n, given["alpha"], given["beta"], **options)
        expected = _variant(given["layers"], n, given["alpha"], given["beta"])
        if abs(wrong - expected) > TOLERANCE * expected and \
                abs(got - wrong) <= TOLERANCE * max(abs(wrong), 1e-12):
            return said
    return None


def _judge(value: dict, given: dict, n: int) -> str | None:
    expected = traced_seconds(value["calls"], given["alpha"], given["beta"])
    problem = number_problem(value["got"], expected, "the seconds", rel=float("inf"))
    if problem:
        return problem
    if abs(value["got"] - expected) <= TOLERANCE * expected:
        return None
    said = _diagnosis(float(value["got"]), given, n)
    inputs = f"layers={given['layers']}, alpha={given['alpha']}, beta={given['beta']}"
    return (f" ({inputs}): got {value['got']!r}, the traced step's collectives cost "
            f"{expected!r} ({len(value['calls'])} all-gathers and reduce-scatters). "
            + (said or "Count every all-gather and reduce-scatter of one step, forward and "
               "backward, each at alpha + beta x (n-1)/n x its padded fp32 bytes."))


def check_fsdp_comm_seconds(fn) -> str:
    seed = new_seed()
    given = {n: problem_inputs(seed, n) for n in (1, 2, 3, 4)}
    each_world(_trial, lambda n: (fn, deal([given[n]] * n)),
               lambda value, rank, n: _judge(value, given[n], n), seed)
    return f"FSDP's communication seconds per step match a traced step on 1 to 4 ranks (seed {seed})"


EXERCISES = (
    Exercise(
        name="14.fsdp_cost", notebook="14_plan_a_parallel_run",
        summary="fsdp_comm_seconds(layers, world_size, alpha, beta): one FSDP step's seconds "
                "in collectives, per rank",
        hint="List the collectives of one step of scratch.FSDP: which tensors are all-gathered "
             "in forward, which again in backward, which gradients are reduce-scattered. Each "
             "costs alpha + beta x the bytes this rank sends in a ring, on fp32 tensors "
             "padded to a multiple of world_size.",
        recipe="For layer k with weight fan_in x fan_out and bias fan_out: all-gather weight and "
               "bias (forward), all-gather the weight again in backward if k > 0, "
               "reduce-scatter weight and bias. For each tensor of numel elements: padded = "
               "numel + (-numel) % n; add alpha + beta * padded * 4 * (n - 1) / n.",
        solution=fsdp_comm_seconds, checker=check_fsdp_comm_seconds,
        answered_by=("ddp_lab.course.ch14_planning.costs:fsdp_calls",)),
)
