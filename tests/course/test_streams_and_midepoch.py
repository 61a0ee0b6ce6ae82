"""Notebook 05b's streams and mid-epoch resume on real ranks: an IterableDataset sharded by
rank and DataLoader worker reads each sample once, equal step counts drop only the tail, and
a run stopped mid-epoch and resumed (sampler epoch + batches consumed + RNG states) repeats
the uninterrupted run's samples, losses and weights exactly."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch
from matplotlib.figure import Figure

import ddp_lab
from ddp_lab.course.ch05_ddp_basics import midepoch, plots, sampling, streams

pytestmark = pytest.mark.timeout(240)


def samples(result: dict) -> list[int]:
    return [s for batch in result["batches"] for s, _ in batch]


@pytest.mark.parametrize("world, workers", [(2, 2), (3, 1)])
def test_a_stream_sharded_by_rank_and_worker_reads_each_sample_once(world, workers):
    n = 13
    values = ddp_lab.run(streams.stream_tour, world_size=world, args=(n, 2, workers),
                         echo=False).values
    assert sampling.coverage([samples(v["unsharded"]) for v in values], n) == [world * workers] * n
    assert sampling.coverage([samples(v["sharded"]) for v in values], n) == [1] * n
    steps = {len(v["equal_steps"]["batches"]) for v in values}
    assert steps == {min(len(v["sharded"]["batches"]) for v in values)}    # equal, the fewest
    read = sum(len(samples(v["equal_steps"])) for v in values)
    assert read + sum(v["equal_steps"]["left_unread"] for v in values) == n
    assert "has no len()" in values[0]["refused"]["DistributedSampler(stream)"]


def test_a_mid_epoch_resume_repeats_the_uninterrupted_run(tmp_path):
    config = midepoch.EpochConfig(samples=24, batch_size=3)     # 4 steps per epoch on 2 ranks
    runs = midepoch.stop_and_resume(tmp_path, stop_after=5, config=config)
    for rank in range(2):
        full, resumed = runs["uninterrupted"][rank], runs["resumed"][rank]
        assert full["steps"] == list(range(8)) and resumed["steps"] == [6, 7]
        assert resumed["samples"] == full["samples"][6:] and resumed["losses"] == full["losses"][6:]
        assert all(map(torch.equal, resumed["weights"], full["weights"][6:]))
        assert runs["resumed, no RNG state"][rank]["losses"] != resumed["losses"]
    assert isinstance(plots.resume_plot({k: v[0] for k, v in runs.items()}), Figure)
    # the loader's own generator: another seed on each rank and in each epoch (workers would
    # otherwise draw the same augmentation everywhere), the same one again after the resume
    seeds = [runs["uninterrupted"][rank]["loader_seeds"] for rank in range(2)]
    assert len({s for per_rank in seeds for s in per_rank.values()}) == 4, seeds
    assert all(runs["resumed"][rank]["loader_seeds"][1] == seeds[rank][1] for rank in range(2))


def test_loader_base_seeds_differ_by_epoch_and_rank():
    bases = midepoch.worker_base_seeds(seed=0, epochs=2, world_size=3)
    assert len(set(bases.values())) == 6
    assert bases == midepoch.worker_base_seeds(seed=0, epochs=2, world_size=3)


def test_rng_states_round_trip_and_the_loader_trap():
    states = midepoch.rng_states()
    first = (torch.rand(3), random.random(), np.random.rand())
    midepoch.set_rng_states(states)
    again = (torch.rand(3), random.random(), np.random.rand())
    assert torch.equal(first[0], again[0]) and first[1:] == again[1:]
    assert midepoch.iterator_moves_global_rng() == {"default": True, "own generator": False}
