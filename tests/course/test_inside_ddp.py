"""Inside DDP (notebook 07): bucket layouts, hooks' bytes, no_sync, bucket views, unused
parameters, the overlap timeline and the sweep, on real ranks and compared with single-process references. Small models; no timing is asserted."""

import argparse

import pytest
import torch
import torch.distributed as dist
from matplotlib.figure import Figure
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.nn.parallel import DistributedDataParallel as DDP

import ddp_lab
from ddp_lab.tools import bench_buckets
from ddp_lab.course.ch07_inside_ddp import accumulation, bucket_sweep, buckets, comm_hooks, memory as ddp_memory, overlap, unused_params
from ddp_lab.course.models import MLPConfig, make_mlp
from ddp_lab.course.units import MiB
from ddp_lab.course.ch07_inside_ddp import plots as pictures

pytestmark = pytest.mark.timeout(90)

TINY = MLPConfig(inputs=32, width=64, depth=3, outputs=32)


def run(fn, world=2, *args, **kwargs):
    return ddp_lab.run(fn, world_size=world, args=args, kwargs=kwargs, timeout=60,
                       echo=False).values


# --- buckets ---------------------------------------------------------------------------

@pytest.mark.parametrize("cap_mb", [None, 0.5, 1, 2, 100])
def test_predicted_layout_is_greedy_in_reverse_order(cap_mb):
    model = make_mlp(buckets.LAYOUT_MODEL)
    sizes = {n: p.numel() * 4 for n, p in model.named_parameters()}
    layout = buckets.predicted_layout(model, cap_mb)
    assert [n for bucket in layout for n in bucket] == list(sizes)[::-1]  # each once, reversed
    for k, bucket in enumerate(layout):
        cap = (dist._DEFAULT_FIRST_BUCKET_BYTES if cap_mb is None and k == 0
               else (25 if cap_mb is None else cap_mb) * MiB)
        bucket_bytes = sum(sizes[n] for n in bucket)
        assert bucket_bytes - sizes[bucket[-1]] < cap  # closes as soon as it reaches the cap
        if k < len(layout) - 1:
            assert bucket_bytes >= cap


def test_reducer_buckets_match_the_prediction_and_leave_in_order():
    layouts = run(buckets.layouts_for_caps, 2, (None, 1))
    for rank_layouts in layouts:
        for layout in rank_layouts:
            names = [n for n, _ in layout["params"]]
            first, rebuilt = layout["buckets"][0], layout["buckets"][1]
            assert len(first) == 1 and first[0]["params"] == names
            assert [r["params"] for r in rebuilt] == layout["predicted"]
            assert [r["index"] for r in rebuilt] == list(range(len(rebuilt)))
            assert all(a["ready"] <= b["ready"] for a, b in zip(rebuilt, rebuilt[1:]))
            assert layout["grad_order"] == names[::-1]
            logged = [int(s) for s in layout["logging"]["rebuilt_bucket_sizes"].split(",")]
            assert logged == [r["bytes"] for r in rebuilt]
            assert sum(logged) == sum(size for _, size in layout["params"])
    assert "fc3" in buckets.bucket_table(layouts[0][0], 1)
    assert isinstance(pictures.bucket_map(layouts[0]), Figure)


# --- hooks -----------------------------------------------------------------------------

def powersgd_floats(config: MLPConfig, rank: int = 1, min_rate: float = 2) -> int:
    """What rank-r PowerSGD sends per step: P (n x r) and Q (m x r) for each weight worth
    compressing, everything else (biases, small matrices) as it is."""
    total = 0
    for fan_in, fan_out in config.layer_shapes():
        n, m = fan_out, fan_in
        compressed = (n + m) * rank
        total += compressed if n * m >= min_rate * compressed else n * m
        total += fan_out  # bias
    return total


def test_hooks_send_the_bytes_they_should():
    results = run(comm_hooks.compare_hooks, 2, steps=4)
    params = comm_hooks.HOOK_MODEL.parameters
    for per_rank in results:
        assert per_rank["all-reduce (default)"]["bytes"] == [4 * params] * 4
        assert per_rank["fp16 compression"]["bytes"] == [2 * params] * 4
        assert per_rank["int8 (custom)"]["bytes"] == [params + 4] * 4  # + the shared scale
        assert per_rank["int8 (custom)"]["calls"] == [2] * 4
        powersgd = per_rank["PowerSGD rank 1"]
        assert powersgd["bytes"][:2] == [4 * params] * 2  # start_powerSGD_iter=2
        assert powersgd["bytes"][2:] == [4 * powersgd_floats(comm_hooks.HOOK_MODEL)] * 2
        (device,) = {r["device"] for r in per_rank.values()}  # a GPU where there is one
        assert device.startswith("cuda" if torch.cuda.is_available() else "cpu")
    for name, r in results[0].items():  # every rank saw the same global loss
        assert r["loss"] == results[1][name]["loss"]
    assert isinstance(pictures.hook_curves(results[0]), Figure)


@pytest.mark.parametrize("backend, gpus, local_rank, expected", [
    ("gloo", 0, 1, "cpu"),                    # no GPU
    ("gloo", 1, 1, "cuda:0"),                 # 2 ranks, 1 GPU: gloo on the shared GPU
    ("gloo", 2, 3, "cuda:1"),
    ("cpu:gloo,cuda:nccl", 2, 1, "cuda:1"),   # "auto" with a GPU per rank: its own
    ("cpu:gloo", 1, 0, "cpu"),                # a group that cannot move CUDA tensors
])
def test_hook_device_is_a_gpu_wherever_the_group_can_use_one(backend, gpus, local_rank, expected):
    from ddp_lab.course.ch07_inside_ddp.workload import hook_device
    assert str(hook_device(backend, gpus, local_rank)) == expected


def test_powersgd_synchronizes_cuda_whenever_it_is_available():
    """torch 2.13's powerSGD_hook.py: ``if torch.cuda.is_available():
    torch.cuda.synchronize(device)``, with the bucket's device, in both hooks (so CPU
    tensors fail on a machine with CUDA; notebook 07 says so, hook_device avoids it)."""
    import inspect

    from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook

    from ddp_lab.course.ch07_inside_ddp.workload import powersgd_cuda_sync_lines
    lines = powersgd_cuda_sync_lines()
    assert len(lines) == 2, lines
    source = inspect.getsource(powerSGD_hook).splitlines()
    for line in lines:
        assert source[line - 1].strip() == "if torch.cuda.is_available():"
        assert source[line].strip() == "torch.cuda.synchronize(device)"


def powersgd_as_on_a_gpu_machine() -> list[str]:
    """PowerSGD on CPU tensors where torch.cuda.is_available() says True (a rank of its own,
    patched): the devices its hook asks torch.cuda.synchronize for."""
    seen = []
    torch.cuda.is_available = lambda: True
    torch.cuda.synchronize = lambda device=None: seen.append(str(device))
    result = comm_hooks.train_with_hook("PowerSGD rank 1", steps=3)
    assert result["device"] == "cpu" and result["bytes"][2] < result["bytes"][0]  # compressed
    return seen


def test_powersgd_on_cpu_tensors_would_synchronize_the_cpu_on_a_gpu_machine():
    """The call that fails there ("Expected a cuda device, but got: cpu"), caught here."""
    for seen in run(powersgd_as_on_a_gpu_machine, 2):
        assert seen and set(seen) == {"cpu"}, seen


def compressed_gradients(hooks: dict) -> dict:
    """Gradients of one step with each hook and with DDP's default (None), same data."""
    grads = {}
    for name, hook in {**hooks, "default": None}.items():
        model = make_mlp(TINY)
        ddp = DDP(model)
        if hook is not None:
            ddp.register_comm_hook(None, hook)
        x = torch.randn(8, TINY.inputs, generator=torch.Generator().manual_seed(dist.get_rank()))
        ddp(x).square().mean().backward()
        grads[name] = torch.cat([p.grad.reshape(-1) for p in model.parameters()])
    return grads


def test_compressed_hooks_stay_close_to_plain_averaging():
    hooks = {"fp16": default_hooks.fp16_compress_hook, "int8": comm_hooks.int8_hook}
    tolerance = {"fp16": 1e-3, "int8": 2e-2}  # relative to the largest gradient
    for g in run(compressed_gradients, 2, hooks):
        scale = g["default"].abs().max().item()
        for name in hooks:
            torch.testing.assert_close(g[name], g["default"], rtol=0,
                                       atol=tolerance[name] * scale)
            assert not torch.equal(g[name], g["default"])  # it really compressed


# --- no_sync ---------------------------------------------------------------------------

@pytest.mark.parametrize("world", [1, 3])
def test_no_sync_equals_one_process_on_the_large_batch(world):
    k = 3
    reference = accumulation.large_batch_reference(world, accumulation=k, steps=2)
    pairs = run(accumulation.accumulation_pair, world, k, 8, 2)
    for pair in pairs:
        for result in pair.values():
            torch.testing.assert_close(result["weights"], reference)
        assert pair["no_sync"]["all_reduces"] == [1, 1]
        assert pair["every micro-batch"]["all_reduces"] == [k, k]
        assert pair["every micro-batch"]["bytes"] == [k * b for b in pair["no_sync"]["bytes"]]
    assert isinstance(pictures.accumulation_bars(pairs[0], k), Figure)


# --- memory, unused parameters ----------------------------------------------------------

def test_bucket_views_put_every_gradient_inside_a_bucket():
    for where in run(ddp_memory.where_gradients_live):
        assert all(where[True].values()) and not any(where[False].values())
        offsets = [where[True][n] for n in ("fc3.bias", "fc3.weight")]
        assert offsets[0][0] == offsets[1][0] and offsets[0][1] < offsets[1][1]


def test_training_memory_reports_a_setup():
    small = MLPConfig(inputs=64, width=64, depth=2, outputs=64)
    setup = "DDP, gradient_as_bucket_view"
    result = run(ddp_memory.training_memory, 1, setup, small)[0]
    assert result["setup"] == setup and result["params_mib"] == small.parameters * 4 / MiB
    assert isinstance(pictures.memory_bars([result, result]), Figure)


def test_unused_parameters_fail_by_default_and_work_with_either_option():
    for r in run(unused_params.train_two_heads):
        assert r["iterations_done"] == 1 and "find_unused_parameters" in r["error"]
    for r in run(unused_params.compare_options)[0]:
        assert r["iterations_done"] == 3 and r["error"] is None
        assert "head_b.weight" not in r["with_grad"]
    assert isinstance(pictures.option_bars({"default": 1.0, "static_graph": 1.1}), Figure)


# --- overlap, sweep, bench ----------------------------------------------------------------

def manual_versus_ddp() -> dict:
    x = torch.randn(4, TINY.inputs, generator=torch.Generator().manual_seed(dist.get_rank()))
    manual, ddp = make_mlp(TINY), DDP(make_mlp(TINY))
    for model in (manual, ddp):
        model(x).square().mean().backward()
    overlap.all_reduce_after_backward(manual)
    return {name: torch.cat([p.grad.reshape(-1) for p in m.parameters()])
            for name, m in (("manual", manual), ("ddp", ddp))}


def test_all_reduce_after_backward_averages_like_ddp():
    for g in run(manual_versus_ddp, 3):
        torch.testing.assert_close(g["manual"], g["ddp"])


def test_timeline_structure():
    timelines = run(overlap.step_timeline, 2, TINY, 0.001, 4, 1, 1)
    for t in timelines:
        backward = [s for s in t["ddp"]["compute"] if s[0] != "forward"]
        assert len(backward) == TINY.depth
        assert len(t["ddp"]["comm"]) == len(buckets.predicted_layout(make_mlp(TINY), 0.001))
        # the Reducer hands bucket 0 over during backward (when gloo's thread gets to run it
        # depends on the scheduler, so only the hand-over is asserted)
        assert t["ddp"]["handed"][0] < max(end for _, _, end in backward)
        assert t["no_overlap"]["comm"][0][1] >= max(e for _, _, e in t["no_overlap"]["compute"])
        assert 0 <= overlap.overlap_fraction(t["ddp"]) <= 1
        for step in (t["ddp"], t["no_overlap"]):      # gloo ran it after it was handed over
            assert all(handed <= start < end for handed, (_, start, end)
                       in zip(step["handed"], step["comm"]))
            assert 1 <= overlap.in_flight(step) <= t["gloo_threads"] == 2
            assert len(set(step["threads"])) <= 2
    assert isinstance(pictures.overlap_timeline(timelines), Figure)


def test_sweep_counts_buckets_and_prints_a_table(capsys):
    args = argparse.ArgumentParser()
    bench_buckets.add_arguments(args)
    args = args.parse_args(["--caps", "0.001", "default", "1000", "--width", "64",
                            "--depth", "3", "--batch", "4", "--iterations", "1"])
    assert bench_buckets.main(args) == 0
    table = capsys.readouterr().out
    for row in ("0.001", "default (25)", "1000", "no overlap", "backward only"):
        assert row in table
    result = run(bucket_sweep.time_buckets, 2, bench_buckets.config_from(args))[0]
    tiny = len(buckets.predicted_layout(make_mlp(bench_buckets.config_from(args).model), 0.001))
    assert tiny == 3  # a 256-byte bias does not fill 1 kB: it shares with its weight
    assert result["buckets"] == {0.001: tiny, None: 1, 1000: 1}
    assert isinstance(pictures.sweep_curve(result), Figure)
