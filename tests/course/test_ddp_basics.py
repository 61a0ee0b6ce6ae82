"""DDP basics (notebook 05): what DDP synchronizes, DDP == one process on the global batch,
seeding, DistributedSampler sharding and evaluation, exact resume from a checkpoint, DDP
with model parallelism. Every multi-rank result is compared with a single-process
reference; no timing is asserted."""

import tempfile
from pathlib import Path

import pytest
import torch
from matplotlib.figure import Figure
from torch.utils.data import DistributedSampler

import ddp_lab
from ddp_lab.course.ch05_ddp_basics import basics as ddp_basics, resume as ddp_checkpoint, equivalence as ddp_equivalence, sampling as ddp_sampling, seeds as ddp_seeds
from ddp_lab.course.ch05_ddp_basics import plots

pytestmark = pytest.mark.timeout(120)


def run(fn, world_size, *args, **kwargs):
    return ddp_lab.run(fn, world_size=world_size, args=args, kwargs=kwargs, echo=False).values


@pytest.mark.parametrize("world", [1, 2, 3])
def test_ddp_equals_one_process_on_the_global_batch(world):
    config = ddp_equivalence.EquivalenceConfig(steps=4, global_batch=12)
    comparison = ddp_equivalence.compare_world_sizes((world,), config)  # asserts too
    reference = ddp_equivalence.single_process_training(config)
    result = comparison["world_sizes"][world]
    for rank, got in enumerate(result["per_rank"]):
        assert len(got["grads"]) == len(got["weights"]) == 4
        torch.testing.assert_close(got["grads"], reference["grads"], msg=f"rank {rank}")
        torch.testing.assert_close(got["weights"], reference["weights"], msg=f"rank {rank}")
        assert not torch.equal(got["weights"][-1], reference["initial"])  # it did train
    worst = max(max(result["max_diff"]["grads"]), max(result["max_diff"]["weights"]))
    assert worst == 0.0 if world == 1 else worst < 1e-6  # against the ranks' device's reference
    assert result["device"] == got["device"] == ("cpu" if world > torch.cuda.device_count()
                                                 else "cuda:0")
    assert set(comparison["references"]) == {"cpu", result["device"]}
    assert isinstance(plots.equivalence_plot(comparison), Figure)


def test_uneven_shards_are_refused():
    with pytest.raises(ValueError, match="does not split evenly"):
        ddp_equivalence.shard(torch.zeros(10), 0, 3)


def test_constructor_broadcasts_and_backward_averages():
    records = run(ddp_basics.anatomy_of_a_step, 3)
    rank0_before = records[0]["before"]
    assert not any(torch.equal(r["before"], rank0_before) for r in records[1:])
    mean_of_own = torch.stack([r["local_grad"] for r in records]).mean(dim=0)
    for r in records:
        assert torch.equal(r["after"], rank0_before)
        torch.testing.assert_close(r["synced_grad"], mean_of_own)
        assert torch.equal(r["synced_grad"], records[0]["synced_grad"])  # the same bits
        assert torch.equal(r["stepped"], records[0]["stepped"])
    assert isinstance(plots.anatomy_picture(records), Figure)


def test_forward_broadcasts_rank0s_buffers():
    facts = ddp_basics.buffer_facts(run(ddp_basics.buffers_in_forward, 2, steps=3))
    assert all(f["identical on entry"] and not f["identical on exit"] for f in facts)
    assert [f["rank 0's previous exit"] for f in facts] == [False, True, True]


def test_forward_broadcasts_after_a_training_forward_and_once_for_the_rebuild():
    per_rank = ddp_lab.run(ddp_basics.collectives_per_forward, world_size=2, echo=False).values
    assert per_rank[0] == per_rank[1]
    counts = {model: [row["in forward"].count("broadcast_") for row in rows]
              for model, rows in per_rank[0].items()}
    # train, train (bucket rebuild), train, no_grad, no_grad, train
    assert counts == {"ToyModel": [0, 2, 0, 0, 0, 0], "ToyModel + BatchNorm1d": [2, 4, 2, 2, 0, 0]}
    for rows in per_rank[0].values():
        assert [row["in backward"] for row in rows] == [
            ["allreduce_"] if row["forward"] == "train" else [] for row in rows]


def test_a_rank_missing_forward_hangs_the_others():
    with pytest.raises(ddp_lab.WorkerTimeout) as caught:
        ddp_lab.run(ddp_basics.straggle_at, world_size=3, args=("forward",), timeout=8,
                    echo=False)
    where = ddp_basics.hang_summary(caught.value.stacks)
    assert caught.value.stuck_ranks == [0, 1, 2]
    assert where[2] == "time.sleep(hold_s)"
    assert "ddp_model(" in where[0] and "broadcast" in where[0]  # the buffers' root waits
    assert "backward()" in where[1]  # rank 1 got its buffers and waits one point later


def test_straggle_at_rejects_unknown_points():
    with pytest.raises(ddp_lab.WorkerError, match="where must be one of"):
        ddp_lab.run(ddp_basics.straggle_at, world_size=1, args=("optimizer",), echo=False)


def test_tutorial_basic_example_and_model_parallel_on_cpu():
    losses = run(ddp_basics.tutorial_basic_example, 2)
    assert len(set(losses)) == 2  # each rank its own random data
    results = run(ddp_basics.model_parallel_step, 2)
    assert ddp_basics.model_parallel_backend(2) in ("gloo", "nccl")
    for r in results:
        assert r["devices"] == ("cpu", "cpu") and r["output_device"] == "cpu"
        assert torch.equal(r["weights"], results[0]["weights"])


def test_seeding_policies():
    per_rank = run(ddp_seeds.seeding_experiment, 3)
    summary = ddp_seeds.summarize([per_rank, per_rank])
    unseeded, same, right = (summary[p] for p in ddp_seeds.POLICIES)
    assert not unseeded["same init on all ranks"] and unseeded["same model after DDP"]
    assert same["same dropout mask on all ranks"] and same["same random batch on all ranks"]
    assert right["same init on all ranks"] and right["same model after DDP"]
    assert not right["same dropout mask on all ranks"]
    assert not right["same random batch on all ranks"]
    assert "per_rank" in ddp_seeds.table(summary)
    assert isinstance(plots.dropout_masks(per_rank, ddp_seeds.POLICIES), Figure)


@pytest.mark.parametrize("n,world", [(10, 4), (12, 3), (7, 2), (3, 4)])
def test_distributed_sampler_shards_are_disjoint_cover_and_pad(n, world):
    """Pure: DistributedSampler with explicit replicas, no process group needed."""
    for epoch in range(3):
        shards = []
        for rank in range(world):
            sampler = DistributedSampler(range(n), num_replicas=world, rank=rank, seed=5)
            sampler.set_epoch(epoch)
            shards.append(list(sampler))
        counts = ddp_sampling.coverage(shards, n)
        assert min(counts) == 1  # every sample at least once
        assert sum(counts) == -(-n // world) * world  # padded up to a multiple of world
        assert len({len(s) for s in shards}) == 1  # equal shard lengths


def test_sampler_on_ranks_set_epoch_and_seed_by_rank():
    n = 10
    shuffled = run(ddp_sampling.sampler_indices, 4, n)
    frozen = run(ddp_sampling.sampler_indices, 4, n, set_epoch=False)
    rank_seeded = run(ddp_sampling.sampler_indices, 4, n, seed_by_rank=True)
    for epoch in range(3):
        assert min(ddp_sampling.coverage([r[epoch] for r in shuffled], n)) == 1
    assert shuffled[0][0] != shuffled[0][1]
    assert frozen[0][0] == frozen[0][1] == frozen[0][2]
    assert 0 in ddp_sampling.coverage([r[0] for r in rank_seeded], n)
    figure = plots.shard_coverage([("epoch 0", [r[0] for r in shuffled])], n)
    assert isinstance(figure, Figure)
    assert isinstance(plots.epoch_orders([("a", shuffled[0]), ("b", frozen[0])], n), Figure)


def test_evaluation_three_ways():
    correct = [True, True, False, True, False, True, True, False, False, False]
    results = run(ddp_sampling.evaluate_three_ways, 4, correct)
    for r in results:
        assert r["padded"]["accuracy"] == pytest.approx(7 / 12)
        assert r["drop_last"]["accuracy"] == pytest.approx(5 / 8)
        assert r["unpadded"]["accuracy"] == pytest.approx(5 / 10)
    assert sorted(i for r in results for i in r["unpadded"]["indices"]) == list(range(10))


def test_resumed_run_is_bit_identical():
    config = ddp_checkpoint.ResumeConfig(steps=6)
    with tempfile.TemporaryDirectory() as folder:
        runs = ddp_checkpoint.stop_and_resume(folder, stop_after=2, config=config)
        assert sorted(p.name for p in Path(folder).iterdir()) == ["toy.pt", "toy_model_only.pt"]
    full, resumed = runs["uninterrupted"], runs["resumed"]
    assert runs["first part"]["steps"] == [0, 1, 2] and resumed["steps"] == [3, 4, 5]
    assert runs["first part"]["losses"] == full["losses"][:3]
    assert resumed["losses"] == full["losses"][3:]
    for step, weights in zip(resumed["steps"], resumed["weights"]):
        assert torch.equal(weights, full["weights"][step])
    lost = runs["resumed, no optimizer state"]
    assert lost["losses"][0] == full["losses"][3]  # computed before any update...
    assert not torch.equal(lost["weights"][-1], full["weights"][-1])  # ...then momentum is missed
    assert isinstance(plots.resume_plot(runs), Figure)


def _resume_from_own_folder(shared, local):
    import os
    import torch.distributed as dist
    path = shared if dist.get_rank() == 0 else local     # rank 1 cannot see rank 0's file
    return ddp_checkpoint.train_toy(ddp_checkpoint.ResumeConfig(), os.path.join(path, "toy.pt"))


def test_a_rank_that_cannot_see_the_checkpoint_is_an_error_not_a_fresh_start(tmp_path):
    """Without the agreement rank 1 started at step 0 while rank 0 resumed at 5, their
    all-reduces paired different steps, and the run ended in 'rank 0 left the run early'."""
    import os
    shared, local = tmp_path / "shared", tmp_path / "local"
    shared.mkdir(), local.mkdir()
    ddp_lab.run(ddp_checkpoint.train_toy, world_size=2, echo=False,
                args=(ddp_checkpoint.ResumeConfig(), os.path.join(shared, "toy.pt"), 4))
    with pytest.raises(ddp_lab.WorkerError, match="not every rank sees the checkpoint"):
        ddp_lab.run(_resume_from_own_folder, world_size=2, args=(str(shared), str(local)),
                    echo=False, timeout=60)


def test_numpy_in_dataloader_workers_differs_and_repeats_without_worker_init_fn():
    first, second = run(ddp_seeds.numpy_in_workers, 2), run(ddp_seeds.numpy_in_workers, 2)
    draws = [d for rank in first for d in rank]
    assert len(set(draws)) == len(draws) == 8 and first == second


def test_sync_batchnorm_refuses_cpu_tensors():
    on_gpus = torch.cuda.device_count() >= 2  # backend="auto" picks NCCL there
    for outcome in run(ddp_basics.sync_batchnorm_on_this_device, 2):
        assert outcome == "ok" if on_gpus else "expected input tensor to be on GPU" in outcome


def test_ddp_prefix_dcp_keys_and_weights_only(tmp_path):
    from ddp_lab.course.ch05_ddp_basics import dcp_checkpoint
    keys = ddp_lab.run(dcp_checkpoint.prefixes, 2, args=(str(tmp_path / "dcp"),),
                       echo=False).values
    for rank in keys:
        assert rank["dcp_keys"] == [k.removeprefix("module.") for k in rank["ddp_keys"]]
        assert rank["plain_refuses"] and rank["restored_equal"]
    loading = dcp_checkpoint.weights_only(str(tmp_path / "settings.pt"))
    assert loading["refused"] and loading["trusted"] == "RunSettings" and loading["plain_ok"]
    # the safe way in: an allowlisted class loads with weights_only=True, inside the with only
    assert "torch.serialization.add_safe_globals" in loading["advice"]
    assert loading["allowlisted"] == "RunSettings" and loading["refused_after"]


def test_model_parallel_ddp_step_equals_one_process_on_both_batches():
    from ddp_lab.course.ch05_ddp_basics import basics, model_parallel_reference
    results = ddp_lab.run(basics.model_parallel_step, 2, backend="gloo", echo=False).values
    for result in results:
        torch.testing.assert_close(result["weights"], model_parallel_reference.one_process_step(2))
