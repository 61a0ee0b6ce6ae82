"""Notebook 09b's launches, for real: mp.spawn scripts with and without the main guard,
orphaned workers found and killed, CUDA_VISIBLE_DEVICES by torch's parser, torchrun's
static mode and its output options, DataParallel on a machine without GPUs."""

from __future__ import annotations

import pytest
from matplotlib.figure import Figure

import ddp_lab
from ddp_lab.course.ch09_torchrun import by_hand, data_parallel, launch_modes
from ddp_lab.course.ch09_torchrun.plots import throughput_bars

pytestmark = pytest.mark.timeout(240)


@pytest.mark.parametrize("value, physical", [
    (None, [0, 1, 2, 3]), ("2,3", [2, 3]), ("3,2", [3, 2]), ("", []), ("1,1", []),
    ("0,-1,2", [0]), ("1,7,2", [1]), ("GPU-a,GPU-b", ["GPU-a", "GPU-b"])])
def test_visible_devices_follow_the_drivers_rules(value, physical):
    assert by_hand.visible_devices(value, gpus=4) == physical


def test_spawn_script_needs_the_main_guard(tmp_path):
    guarded = by_hand.run_python(by_hand.SPAWN_SCRIPT, "--nprocs", "2")
    assert guarded.returncode == 0 and guarded.stdout.count("all_reduce sum 3") == 2
    unguarded = by_hand.run_python(by_hand.unguarded_copy(str(tmp_path)))
    assert unguarded.returncode != 0 and "bootstrapping phase" in unguarded.stderr


def test_orphaned_workers_are_found_by_marker_and_killed():
    orphaned = by_hand.start_and_orphan(hold_s=60)
    found = by_hand.find_marked(orphaned["token"])
    spawned = {r["pid"] for r in found if r["spawn_main"]}
    assert len(spawned) == 2 and spawned <= set(orphaned["workers"])
    assert all(r["ppid"] != orphaned["parent"] for r in found)
    assert set(by_hand.kill_marked(orphaned["token"])) >= spawned
    assert by_hand.find_marked(orphaned["token"]) == []


def test_static_rendezvous_uses_node_rank_and_c10d_ignores_it():
    static = launch_modes.static_nodes()
    assert static.returncodes == [0, 0]
    assert {r: v["env"]["GROUP_RANK"] for r, v in static.values.items()} == {0: "0", 1: "1"}
    c10d = launch_modes.c10d_same_node_rank(node_rank=1)
    assert c10d.returncodes == [0, 0]
    assert sorted(v["env"]["GROUP_RANK"] for v in c10d.values.values()) == ["0", "1"]
    assert all(any("node_rank is only used" in line for line in out) for out in c10d.outputs)


def test_run_path_redirect_tee_and_no_python(tmp_path):
    shown = launch_modes.output_options(str(tmp_path))
    assert shown.returncode == 0 and not shown.lines("RANK=0 LOCAL_RANK=0")
    assert shown.lines("[default1]:RANK=1")
    files = launch_modes.log_files(str(tmp_path))
    assert sum(p.endswith("stdout.log") and "RANK=" in t for p, t in files.items()) == 2
    plain = launch_modes.no_python()
    assert plain.returncode == 0
    assert sorted(l.strip() for l in plain.output.splitlines() if l.strip().isdigit()) == \
        ["0", "0", "1", "1", "2", "2"]


def test_data_parallel_without_gpus_is_the_bare_model():
    work = data_parallel.Workload(width=64, depth=2, batch=16, steps=2)
    alone = data_parallel.one_process(work)
    assert alone["device_ids"] == [] and alone["bare model"] > 0 and alone["DataParallel"] > 0
    ddp_rate = ddp_lab.run(data_parallel.ddp_rank, world_size=2, args=(work,), echo=False)[0]
    assert ddp_rate > 0
    assert isinstance(throughput_bars({"a": 1.0, "b": 2.0}), Figure)
