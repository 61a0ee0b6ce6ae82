"""All-reduce from send/recv (notebook 04): every algorithm equals dist.all_reduce and a
single-process sum, sends the bytes its design predicts, and the plots and the bench report
work on real (tiny) measurements. No timing is asserted."""

import pytest
import torch
from matplotlib.figure import Figure

import ddp_lab
from ddp_lab.tools import bench_allreduce
from ddp_lab.course.ch04_allreduce import allreduce as ar
from ddp_lab.course.alpha_beta import fit_alpha_beta
from ddp_lab.course.ch04_allreduce.sweep import SweepConfig, measure_sweep
from ddp_lab.course.ch04_allreduce.plots import allreduce_curves, bytes_per_rank, ring_steps, threads_effect

try:  # hypothesis is not a declared dependency: the property test runs where it is installed
    from hypothesis import given, settings, strategies as st
except ImportError:
    given = None

pytestmark = pytest.mark.timeout(60)

CASES = [((10,), torch.float32, False), ((3,), torch.int64, False),
         ((5, 7), torch.float64, True), ((2, 3, 4), torch.int32, False),
         ((), torch.float32, False), ((0,), torch.float32, False)]


def reference(shape, dtype, world, seed=0):
    """The single-process sum of what every rank holds (same generator as the workers)."""
    total = None
    for rank in range(world):
        gen = torch.Generator().manual_seed(seed * 1000 + rank)
        mine = (torch.randn(shape, generator=gen).to(dtype) if dtype.is_floating_point
                else torch.randint(-100, 100, shape, generator=gen).to(dtype))
        total = mine if total is None else total + mine
    return total


@pytest.mark.parametrize("world", [1, 2, 3, 4])
def test_every_algorithm_equals_all_reduce(world):
    for shape, dtype, transposed in CASES:
        res = ddp_lab.run(ar.compare_with_builtin, world_size=world,
                          args=(shape, dtype, 0, transposed), echo=False)
        expected = reference(shape, dtype, world)
        for rank, out in enumerate(res.values):
            assert ("halving_doubling" in out) == (world != 3)
            for name, (got, _) in out.items():
                assert got.dtype == dtype and got.shape == expected.shape
                torch.testing.assert_close(got, out["builtin"][0],
                                           msg=f"{name} rank {rank} {shape} {dtype}")
                torch.testing.assert_close(got, expected, msg=f"{name} vs reference")


@pytest.mark.skipif(not (torch.distributed.is_nccl_available()
                         and torch.cuda.device_count() >= 2), reason="needs 2 GPUs and NCCL")
def test_every_algorithm_runs_on_cuda_tensors_under_nccl():
    # The scratch buffers follow the tensor's device: a CPU buffer would make the NCCL irecv
    # fail ("No backend type associated with device type cpu").
    res = ddp_lab.run(ar.compare_with_builtin, world_size=2, backend="nccl",
                      args=((10,), torch.float32, 0, False, "cuda"), echo=False)
    expected = reference((10,), torch.float32, 2)
    for out in res.values:
        for name, (got, _) in out.items():
            torch.testing.assert_close(got, expected, msg=name)


@pytest.mark.parametrize("world", [2, 3, 4])
def test_bytes_sent_match_the_prediction(world):
    numel = 12  # divisible by 2, 3 and 4: the chunked prediction is exact
    out = ddp_lab.run(ar.compare_with_builtin, world_size=world, args=((numel,),),
                      echo=False).values
    for name in (n for n in ar.ALGORITHMS if n in out[0]):
        measured = [rank_out[name][1] for rank_out in out]
        assert measured == pytest.approx(ar.predicted_bytes(name, numel * 4, world))


def test_uneven_sizes_and_halving_doubling_rejects_three_ranks():
    res = ddp_lab.run(ar.compare_with_builtin, world_size=4, args=((7,), torch.int64, 3),
                      echo=False)
    torch.testing.assert_close(res[2]["ring"][0], reference((7,), torch.int64, 4, seed=3))
    with pytest.raises(ddp_lab.WorkerError, match="power-of-two"):
        ddp_lab.run(ar.halving_doubling, world_size=3, args=(torch.ones(4),), echo=False)


def test_ring_trace_shows_chunks_summing_then_spreading():
    traces = ddp_lab.run(ar.ring_trace, world_size=4, echo=False).values
    phases = [phase for phase, _, _ in traces[0]]
    assert phases == ["input"] + ["reduce-scatter"] * 3 + ["all-gather"] * 3
    after_reduce_scatter = traces[0][3][2]
    assert (after_reduce_scatter.view(4, 2)[1] == 1111).all()  # rank r owns chunk r+1
    assert all((t[-1][2] == 1111).all() for t in traces)
    fig = ring_steps(traces)
    assert isinstance(fig, Figure) and len(fig.axes) == 7


if given is not None:
    @settings(max_examples=12, deadline=None)
    @given(world=st.integers(1, 4), shape=st.lists(st.integers(0, 9), max_size=3),
           dtype=st.sampled_from([torch.float32, torch.float64, torch.int64, torch.int32]),
           seed=st.integers(0, 99))
    def test_property_any_shape_size_dtype(world, shape, dtype, seed):
        out = ddp_lab.run(ar.compare_with_builtin, world_size=world,
                          args=(tuple(shape), dtype, seed), echo=False).values
        expected = reference(tuple(shape), dtype, world, seed)
        for rank_out in out:
            for name, (got, _) in rank_out.items():
                torch.testing.assert_close(got, expected, msg=f"{name}, {world} ranks")


def test_fit_recovers_a_known_line():
    sizes = [1024 * 4 ** k for k in range(6)]
    fit = fit_alpha_beta(sizes, [1e-4 + 1e-9 * s for s in sizes])
    assert fit.alpha == pytest.approx(1e-4) and fit.beta == pytest.approx(1e-9)
    assert fit.r2 == pytest.approx(1.0) and fit.max_rel_error < 1e-9


def test_tiny_sweep_report_and_figures(tmp_path):
    config = SweepConfig(sizes=(1024, 4096, 16384), repeats=2, large_repeats=1)
    one, many = bench_allreduce.measure(config, (2, 4), threads=2, progress=lambda _: None)
    report = bench_allreduce.format_report(one, many)
    for text in ("2 ranks", "4 ranks", "alpha-beta", "halving_doubling", "gloo",
                 "threads per rank", "target not measured"):
        assert text in report
    assert one.busbw(4, "ring", 4096) == pytest.approx(one.algbw(4, "ring", 4096) * 1.5)
    paths = bench_allreduce.save_figures(one, many, str(tmp_path))
    assert all((tmp_path / p.split("/")[-1]).stat().st_size > 10_000 for p in paths)
    assert isinstance(allreduce_curves(one), Figure)
    assert len(bytes_per_rank(one, 2, 4096).axes) == 1
    assert len(threads_effect(one, many, 4, 16384).axes) == 1
    assert "halving_doubling" not in measure_sweep(config, (3,)).algorithms(3)
