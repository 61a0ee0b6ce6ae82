"""The capstone (notebook 07b): write your own DDP, checked against torch's.

The learner's class is used as ``cls(module, bucket_mb=...)``: called like the module,
``.sync_gradients()`` before the optimizer step, ``.module`` the wrapped model. On 1-4 ranks,
bucketed (and per parameter on 1 and 3), ``capstone_trial.run_trial`` trains it on inputs the
checker made and dealt, and ``capstone_trial.torchs_trial`` trains torch's
DistributedDataParallel on the same inputs in ranks of its own; the checker compares. The
model has a frozen layer, a branch some ranks skip, a layer no rank uses and a float16
parameter whose summed gradient overflows unless divided first (summing it in float32 is
right too).
Every collective is seen at the dispatcher (``BackwardTrace``: ``dist.all_reduce``, imported
names, process-group methods and functional collectives alike), so the check requires:
rank 0's state after construction; one all-reduce per bucket (one dtype per bucket), in
bucket order on every rank, with at most one small extra collective (a map of the parameters
used); every bucket that can go during backward issued there, without waiting (one rank is
late in the first step); every all-reduce's work handle waited on before
``sync_gradients()`` returns (``wait_ledger``); torch's gradients (None where no rank used a
parameter) and parameters; ``no_sync()`` as torch's if the class has it; and two backwards
without ``sync_gradients()`` either averaged like torch or refused with an error.
"""

from __future__ import annotations

from ddp_lab.course.ch07_inside_ddp.capstone_launches import judge_launches
from ddp_lab.course.ch07_inside_ddp.capstone_trial import (BUCKET_MB, STEPS, CapstoneNet,
                                                           dealt_inputs, grad_differences,
                                                           locally_unused, run_trial,
                                                           tensor_difference, torchs_trial)
from ddp_lab.exercises.driver import WORLD_SIZES, each_world, new_seed, run_ranks
from ddp_lab.exercises.driver import where as on
from ddp_lab.exercises.registry import Exercise, ExerciseFailed
from ddp_lab.exercises.sealed import deal
from ddp_lab.scratch.ddp import DDP

# Bucketed on every world size; one parameter per bucket (the same code with buckets of one)
# on 1 and 3 ranks, so that the check stays within seconds.
VARIANTS = {1: (None, BUCKET_MB), 2: (BUCKET_MB,), 3: (None, BUCKET_MB), 4: (BUCKET_MB,)}
HANG_HINT = ("Every rank must issue the same collectives in the same order: bucket k only "
             "after buckets 0..k-1, also where a parameter got no gradient on this rank.")


def plan(bucket_mb) -> list[list[tuple[str, int, str]]]:
    """The buckets the check expects, as (name, numel, dtype) per parameter."""
    model = CapstoneNet()
    names = {id(p): name for name, p in model.named_parameters()}
    trainable = [p for p in model.parameters() if p.requires_grad]
    return [[(names[id(p)], p.numel(), str(p.dtype).replace("torch.", "")) for p in bucket]
            for bucket in DDP.plan_buckets(trainable, bucket_mb)]


def check_your_own_ddp(cls) -> str:
    seed, checked_no_sync = new_seed(), False
    for n in WORLD_SIZES:
        late_rank, late_s = seed % n, (0.5 + seed % 300 / 1000 if n > 1 else 0.0)
        inputs = dealt_inputs(seed, n)
        torchs = torchs_run(inputs, n, seed)
        for bucket_mb in VARIANTS[n]:
            label = "None" if bucket_mb is None else f"{bucket_mb:.6f}"
            where = f"{on(n, seed)}, bucket_mb={label}"
            results = each_world(
                run_trial, (cls, deal(inputs), bucket_mb, late_rank, late_s), seed=seed,
                sizes=(n,), place=lambda n, where=where: where, hang_hint=HANG_HINT,
                timeout=15, judge_world=lambda results, n, where=where, mb=bucket_mb:
                _judge_variant(results, where, mb, late_s, inputs[0][0], torchs))[n]
            checked_no_sync |= any("no_sync" in result for result in results)
    # From what the ranks saw: here ``cls`` may be the sealed stand-in, not the class.
    no_sync = "no_sync() as torch's" if checked_no_sync else "(no no_sync() to check)"
    return (f"torch's DDP gradients and parameters after {STEPS} steps with frozen, unused and "
            f"float16 parameters; one all-reduce per bucket, in order, issued during backward "
            f"without waiting; {no_sync}; on 1-4 ranks (seed {seed})")


def torchs_run(inputs: list, n: int, seed: int) -> list[dict]:
    """torch's DDP on the same inputs, in ranks of its own: what every rank should see."""
    return run_ranks(torchs_trial, n, (deal(inputs),), where=f"torch's DDP {on(n, seed)}")


def _judge_variant(results: list, where: str, bucket_mb, late_s: float, start: dict,
                   torchs: list) -> None:
    """Every rank's construction first, then every rank's steps, then accumulation."""
    for rank, result in enumerate(results):
        _judge_construction(where, rank, tensor_difference(result["constructed"], start))
    for rank, result in enumerate(results):
        _judge_steps(where, rank, result, bucket_mb, late_s, torchs[rank])
    for rank, result in enumerate(results):
        _judge_accumulation(where, rank, result, torchs[rank])


def _judge_construction(where: str, rank: int, difference) -> None:
    if difference is not None:
        raise ExerciseFailed(
            f"{where}, rank {rank}: right after construction, {difference[0]} differs from "
            f"rank 0's by up to {difference[1]} (every rank starts from a different random "
            "model here). The constructor must dist.broadcast every parameter (frozen ones "
            "too) and every buffer from rank 0.")


def _judge_steps(where: str, rank: int, result: dict, bucket_mb, late_s: float,
                 torchs: dict) -> None:
    buckets = plan(bucket_mb)
    for step, (record, oracle) in enumerate(zip(result["steps"], torchs["steps"])):
        at = f"{where}, rank {rank}, step {step}"
        judge_launches(at, record["issued"], buckets, locally_unused(step, rank))
        if step == 0 and late_s:  # one rank late
            _judge_waiting(at, record, result["late_s"], late_s)
        if record["unwaited"] > 0:
            raise ExerciseFailed(
                f"{at}: sync_gradients() returned without waiting on {record['unwaited']} of "
                "this step's all-reduces (no work.wait(), nor a wait on its Future). Their sums "
                "may not be there yet (here a later collective happened to finish after them, "
                "which nothing promises): sync_gradients() must wait on every work handle "
                "before it reads the buffers.")
        if record["changed_after"]:
            raise ExerciseFailed(
                f"{at}: {record['changed_after']}'s gradient changed after sync_gradients() "
                "had returned (another rank was late, so the all-reduce was still running): "
                "sync_gradients() must wait on every work handle (work.wait()) before it "
                "returns, not sleep or skip the wait.")
        _judge_grads(at, grad_differences(record["grads"], oracle["grads"]), "")
        difference = tensor_difference(record["params"], oracle["params"])
        if difference is not None:
            name, diff = difference
            raise ExerciseFailed(
                f"{at}: after the optimizer step, {name} differs from torch's DDP by up to "
                f"{diff}. The gradients must be the average over the ranks: divide by the "
                "world size and sum with the all-reduce.")


def _judge_waiting(at: str, record: dict, my_late_s: float, late_s: float) -> None:
    if not my_late_s and record["backward_s"] > late_s / 2:
        raise ExerciseFailed(
            f"{at}: backward() took {record['backward_s']:.2f} s here while another rank "
            f"started {late_s:.2f} s late: something in your hooks waited for the other ranks "
            "(async_op=False, or work.wait() in the hook). Launch with async_op=True and "
            "keep the work; wait only in sync_gradients().")
    if my_late_s and record["sync_s"] > late_s / 2:
        raise ExerciseFailed(
            f"{at}: this rank started {late_s:.2f} s late, so every other rank had issued its "
            f"all-reduces long before, yet sync_gradients() took {record['sync_s']:.2f} s here: "
            "it must wait on the work handles (work.wait()), not sleep.")


def _judge_grads(at: str, differences: list, context: str) -> None:
    if not differences:
        return
    name, kind, detail = differences[0]
    say = {
        "none": f"{name}.grad is a tensor where torch's is None: no rank computed a gradient "
                "for it in this step (frozen, or unused everywhere). Leave .grad None there: "
                "all-reduce a map of the parameters each rank used, and skip those no rank "
                "used (zeros would still move it through momentum and weight decay).",
        "missing": f"{name}.grad is None where torch's is the average: this rank did not use "
                   "it, but others did; it gets their average (its own share counted as "
                   "zeros).",
        "overflow": f"{name}'s {detail} gradient is inf or nan where torch's is finite: 40000 "
                    "on every rank, summed over the ranks, overflows float16 (65504 at most). "
                    "torch divides each gradient by the world size while copying it into the "
                    "bucket, before the sum: divide first.",
        "values": f"{name}'s gradient differs from torch's DDP by up to {detail}. The "
                  "gradients must be the average over the ranks: divide by the world size "
                  "and sum with the all-reduce, then wait before reading the result.",
    }[kind]
    raise ExerciseFailed(f"{at}{context}: {say}")


def _judge_accumulation(where: str, rank: int, result: dict, torchs: dict) -> None:
    at = f"{where}, rank {rank}"
    if "no_sync" in result:
        if result["no_sync"]["raised"]:
            raise ExerciseFailed(
                f"{at}: gradient accumulation inside no_sync() (one micro-batch in "
                "no_sync(), then one synced, as with torch's no_sync()) raised "
                f"{result['no_sync']['raised']}")
        if result["no_sync"]["inside"]:
            raise ExerciseFailed(f"{at}: inside no_sync() your DDP issued "
                                 f"{result['no_sync']['inside']} all-reduces: no_sync() keeps "
                                 "the gradients local until the first backward after it.")
        _judge_grads(at, grad_differences(result["no_sync"]["grads"], torchs["no_sync"]),
                     ", one micro-batch in no_sync() then one synced (against torch's "
                     "no_sync())")
    twice = result.get("twice", {"raised": "not run"})
    differences = grad_differences(twice["grads"], torchs["twice"]) \
        if twice["raised"] is None else []
    if differences:
        name, kind, detail = differences[0]
        raise ExerciseFailed(
            f"{at}: two backward passes with no sync_gradients() between them left {name}'s "
            f"gradient different from torch's DDP ({kind} {detail}; torch averages each "
            "backward). Raise an error when a gradient arrives a second time before "
            "sync_gradients() (else a forgotten sync_gradients() goes unnoticed), and offer "
            "no_sync() for gradient accumulation.")


HINT = ("Three jobs. The same start: every rank takes rank 0's parameters and buffers. "
        "Gradients averaged as they become ready: a hook on each parameter that trains, "
        "buckets of one dtype in reverse parameter order, each launched without waiting once "
        "its gradients are final and the buckets before it have gone. sync_gradients() "
        "finishes: buckets held back by parameters this rank did not use, the wait, the "
        "averages into .grad. The check's report names the trap it found.")

RECIPE = """\
__init__(module, bucket_mb):
  1. self.module = module; broadcast (src=0, under torch.no_grad()) every tensor of
     module.parameters() and module.buffers(), frozen parameters too.
  2. params = the parameters with requires_grad; plan buckets over reversed(params): one open
     bucket per dtype, a parameter joins its dtype's bucket, which closes once it holds
     bucket_mb * 2**20 bytes or more (bucket_mb=None: one parameter per bucket); sort the
     buckets by the position of their first parameter.
  3. p.register_post_accumulate_grad_hook(self._ready) on each of params.
_ready(p): mark p arrived in its bucket (a second arrival before sync_gradients(): raise);
  while the next bucket to launch has all its gradients: launch it and move on.
launch(bucket): flat = torch.cat of the grads (zeros for a grad that is None), divided by the
  world size BEFORE the sum; work = dist.all_reduce(flat, async_op=True); keep (work, flat).
sync_gradients():
  1. launch every bucket not launched yet, in order (their unused parameters count as zeros);
  2. all-reduce a tensor with 1 for each parameter used on this rank (0 after it: no rank used
     it);
  3. for each (work, flat): work.wait(), then copy each parameter's slice into its .grad
     (set .grad where it is None), except parameters no rank used: their .grad stays None;
  4. reset the per-step state.
forward(*args, **kwargs): self.module(*args, **kwargs).
Optional: no_sync(), a context manager during which the hooks launch nothing."""

EXERCISES = (
    Exercise(
        name="07b.your_own_ddp",
        notebook="07b_capstone_your_own_ddp",
        summary="MyDDP(module, bucket_mb=None): broadcast at construction, async all-reduce "
                "from post-accumulate-grad hooks (per parameter or per bucket), "
                "sync_gradients() before the step",
        hint=HINT,
        recipe=RECIPE,
        solution=DDP,
        checker=check_your_own_ddp,
    ),
)
