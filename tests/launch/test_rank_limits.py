"""Per-rank resource limits (``DDP_LAB_RANK_LIMITS``, launch/rank/limits.py): read and
checked before any process starts, applied in every rank (and every torchrun worker), and a
rank that exceeds one fails alone, as a crash with its cause."""

from __future__ import annotations

import os
import resource
import signal
import textwrap

import pytest

import ddp_lab
from ddp_lab.launch.rank.limits import LIMITS_VAR, parse_limits

pytestmark = pytest.mark.timeout(180)
GIB = 1 << 30


@pytest.mark.parametrize("text, parsed", [
    ("", ()),
    ("memory=4G", (("memory", 4 * GIB),)),
    (" cpu = 600 , file_size=512M,open_files=64 ", (("cpu", 600), ("file_size", 512 << 20),
                                                    ("open_files", 64))),
    ("memory=2048", (("memory", 2048),)),
    ("memory=1gb", (("memory", GIB),)),
])
def test_limits_are_parsed(text, parsed):
    assert parse_limits(text) == parsed


@pytest.mark.parametrize("text, says", [
    ("mem=4G", "unknown limit 'mem'"),
    ("memory=lots", "is not a size such as 4G"),
    ("cpu=1.5", "is not a positive whole number"),
    ("cpu=0", "is not a positive whole number"),
    ("memory", "is not a size"),
])
def test_a_bad_limit_fails_before_any_process_starts(text, says):
    with pytest.raises(ValueError, match=says):
        ddp_lab.run(os.getpid, 2, env={LIMITS_VAR: text})


def limits_seen() -> dict:
    return {"memory": resource.getrlimit(resource.RLIMIT_DATA),
            "cpu": resource.getrlimit(resource.RLIMIT_CPU),
            "files": resource.getrlimit(resource.RLIMIT_NOFILE)}


def test_every_rank_runs_under_the_limits_and_never_above_the_hard_ones():
    hard_files = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    asked = f"memory=3G,cpu=100,open_files={hard_files * 2}"
    seen = ddp_lab.run(limits_seen, 2, echo=False, env={LIMITS_VAR: asked}).values
    assert seen[0] == seen[1]
    assert seen[0]["memory"] == (3 * GIB, 3 * GIB) and seen[0]["cpu"] == (100, 101)
    assert seen[0]["files"] == (hard_files, hard_files)  # capped at what the system allows
    assert ddp_lab.run(limits_seen, 1, echo=False).values[0] == limits_seen()  # none asked


def allocate(gib: float) -> float:
    import torch
    return torch.ones(int(gib * GIB / 4)).sum().item()


def spin() -> None:
    while True:
        pass


def test_a_rank_over_its_memory_limit_fails_alone_with_the_cause():
    with pytest.raises(ddp_lab.WorkerError, match="can't allocate memory") as caught:
        ddp_lab.run(allocate, 1, args=(1.5,), echo=False, env={LIMITS_VAR: "memory=1G"})
    assert caught.value.rank == 0
    assert ddp_lab.run(allocate, 1, args=(0.1,), echo=False,
                       env={LIMITS_VAR: "memory=1G"}).values == [pytest.approx(0.1 * GIB / 4)]


def test_a_rank_over_its_cpu_time_is_stopped_by_sigxcpu():
    with pytest.raises(ddp_lab.WorkerError) as caught:
        ddp_lab.run(spin, 1, echo=False, timeout=30, env={LIMITS_VAR: "cpu=1"})
    assert caught.value.exitcode == -signal.SIGXCPU


REPORT_LIMITS = textwrap.dedent("""
    import resource
    import torch.distributed as dist
    import ddp_lab
    dist.init_process_group("gloo")
    ddp_lab.report(resource.getrlimit(resource.RLIMIT_DATA))
    dist.destroy_process_group()
""")


def test_torchrun_workers_inherit_the_limits(tmp_path):
    script = tmp_path / "limits.py"
    script.write_text(REPORT_LIMITS)
    seen = ddp_lab.run_script(str(script), world_size=2, launcher="torchrun", echo=False,
                              env={LIMITS_VAR: "memory=3G"})
    assert seen.values == [(3 * GIB, 3 * GIB)] * 2
