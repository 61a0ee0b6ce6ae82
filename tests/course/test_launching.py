"""Notebook 09b's launches: CUDA_VISIBLE_DEVICES by the driver's rules and DataParallel on a
machine without GPUs. The real launches (mp.spawn with and without the main guard, orphaned
workers found and killed, torchrun's static and c10d node ranks, its output options and
--no-python) are asserted by notebook 09b itself, which the suite executes."""

from __future__ import annotations

import pytest
from matplotlib.figure import Figure

import ddp_lab
from ddp_lab.course.ch09_torchrun import by_hand, data_parallel
from ddp_lab.course.ch09_torchrun.plots import throughput_bars

pytestmark = pytest.mark.timeout(240)


@pytest.mark.parametrize("value, physical", [
    (None, [0, 1, 2, 3]), ("2,3", [2, 3]), ("3,2", [3, 2]), ("", []), ("1,1", []),
    ("0,-1,2", [0]), ("1,7,2", [1]), ("GPU-a,GPU-b", ["GPU-a", "GPU-b"])])
def test_visible_devices_follow_the_drivers_rules(value, physical):
    assert by_hand.visible_devices(value, gpus=4) == physical


def test_data_parallel_without_gpus_is_the_bare_model():
    work = data_parallel.Workload(width=64, depth=2, batch=16, steps=2)
    alone = data_parallel.one_process(work)
    assert alone["device_ids"] == [] and alone["bare model"] > 0 and alone["DataParallel"] > 0
    ddp_rate = ddp_lab.run(data_parallel.ddp_rank, world_size=2, args=(work,), echo=False)[0]
    assert ddp_rate > 0
    assert isinstance(throughput_bars({"a": 1.0, "b": 2.0}), Figure)
