"""Notebook 09b: SLURM's variables mapped to torchrun's arguments and to env://, the
per-task launch run for real, and ``--nproc-per-node`` by name."""

from __future__ import annotations

import pytest
import torch

from ddp_lab.course.ch09_torchrun import launch_modes, slurm


@pytest.mark.parametrize("nodelist, hosts", [
    ("gpu01", ["gpu01"]),
    ("gpu[01-03,07]", ["gpu01", "gpu02", "gpu03", "gpu07"]),
    ("a[8-10],login1", ["a8", "a9", "a10", "login1"]),
    ("n[009-011]", ["n009", "n010", "n011"]),
    ("r[1-2]n[8-9]", ["r1n8", "r1n9", "r2n8", "r2n9"]),
    ("x1,y[2,4],z", ["x1", "y2", "y4", "z"]),
])
def test_expand_hostlist_like_scontrol_show_hostnames(nodelist, hosts):
    assert slurm.expand_hostlist(nodelist) == hosts


def test_srun_env_is_a_block_distribution():
    tasks = slurm.srun_env(["gpu01", "gpu02"], 3, nodelist="gpu[01-02]")
    assert [(t["SLURM_PROCID"], t["SLURM_NODEID"], t["SLURM_LOCALID"]) for t in tasks] == [
        ("0", "0", "0"), ("1", "0", "1"), ("2", "0", "2"),
        ("3", "1", "0"), ("4", "1", "1"), ("5", "1", "2")]
    assert {t["SLURM_NTASKS"] for t in tasks} == {"6"}
    assert {t["SLURMD_NODENAME"] for t in tasks[3:]} == {"gpu02"}


def test_torchrun_args_per_node():
    node1 = slurm.srun_env(["gpu01", "gpu02"], 1, job_id="77", nodelist="gpu[01-02]")[1]
    assert slurm.torchrun_args(node1, "gpu", rdzv_port=29400) == [
        "--nnodes=2", "--node-rank=1", "--nproc-per-node=gpu", "--rdzv-backend=c10d",
        "--rdzv-endpoint=gpu01:29400", "--rdzv-id=77"]


def test_env_for_task_is_what_env_init_reads():
    task = slurm.srun_env(["gpu01", "gpu02"], 4, nodelist="gpu[01-02]")[6]
    assert slurm.env_for_task(task, master_port=12345) == {
        "RANK": "6", "LOCAL_RANK": "2", "WORLD_SIZE": "8", "MASTER_ADDR": "gpu01",
        "MASTER_PORT": "12345"}


def test_sbatch_scripts_use_the_same_mappings():
    per_task, per_node = slurm.sbatch_per_task(), slurm.sbatch_torchrun()
    for name, source in slurm.PER_TASK_VARS.items():
        assert f"{name}=${source}" in per_task
    for arg in ("--nnodes=$SLURM_NNODES", "--node-rank=$SLURM_NODEID", "--rdzv-backend=c10d",
                "--rdzv-id=$SLURM_JOB_ID"):
        assert arg in per_node
    assert 'scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n1' in per_task


def test_sbatch_torchrun_gives_each_node_its_own_node_rank():
    """The printed script (a), run through bash as sbatch and srun would: each node's shell
    expands $SLURM_NODEID, and every task starts torchrun_args of its own variables."""
    nodes, port = ["gpu01", "gpu02", "gpu03"], 29500 + 4242 % 1000
    started = slurm.sbatch_dry_run(slurm.sbatch_torchrun(3, 4), nodes, 1, "gpu[01-03]")
    assert [t["command"][2] for t in started] == [
        "--node-rank=0", "--node-rank=1", "--node-rank=2"]
    job = slurm.srun_env(nodes, 1, nodelist="gpu[01-03]")
    assert [t["command"] for t in started] == [
        ["torchrun", *slurm.torchrun_args(t, 4, port), "train.py"] for t in job]


def test_bare_srun_torchrun_gives_every_node_rank_0():
    """The unquoted form: the batch shell expands $SLURM_NODEID once, on the first node."""
    script = slurm.sbatch_torchrun(2, 8, per_task_expansion=False)
    started = slurm.sbatch_dry_run(script, ["gpu01", "gpu02"], 1, "gpu[01-02]")
    assert [t["command"][2] for t in started] == ["--node-rank=0", "--node-rank=0"]


def test_sbatch_per_task_exports_env_for_task():
    nodes, port = ["gpu01", "gpu02"], 29500 + 4242 % 1000
    started = slurm.sbatch_dry_run(slurm.sbatch_per_task(2, 3), nodes, 3, "gpu[01-02]")
    assert [t["command"] for t in started] == [["python", "train.py"]] * 6
    assert [t["env"] for t in started] == [
        slurm.env_for_task(t, port) for t in slurm.srun_env(nodes, 3, nodelist="gpu[01-02]")]


def test_sbatch_dry_run_reports_a_failing_script():
    with pytest.raises(RuntimeError, match="exit code 3"):
        slurm.sbatch_dry_run("exit 3", ["gpu01"], 1)


def test_virtual_local_rank_narrows_cuda_visible_devices():
    assert launch_modes.virtual_local_rank("5,1") == {0: ("0", "5"), 1: ("0", "1")}


def test_per_task_run_joins_ranks_through_env_alone():
    result = slurm.per_task_run(tasks=2)
    assert result.returncodes == [0, 0], result.outputs
    assert sorted(result.values) == [0, 1]
    for rank, report in result.values.items():
        assert report["env"]["RANK"] == str(rank) and report["env"]["WORLD_SIZE"] == "2"
        assert report["env"]["GROUP_RANK"] is None  # no torchrun agent in between
        assert report["sum"] == 1.0


def test_nproc_per_node_auto_counts_cpus_and_gpu_needs_cuda():
    auto, gpu = launch_modes.nproc_per_node("auto", "gpu")
    workers = [line for line in auto.lines() if line.strip().isdigit()]
    expected = (torch.accelerator.device_count() if torch.accelerator.is_available()
                else torch._utils.cpu_count())
    assert auto.returncode == 0 and workers == [str(expected)] * expected
    if not torch.cuda.is_available():
        assert gpu.returncode != 0 and "ValueError: Cuda is not available." in gpu.output
