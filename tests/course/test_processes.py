"""Notebook 01's demos on real ranks (world sizes 1 to 4), checked against what a single
process computes, plus the pure helpers and the barrier timeline figure. The init methods and stores are in test_stores.py."""

from __future__ import annotations

import io

import pytest
import torch
import torch.distributed as dist
from torch.testing import assert_close

import ddp_lab
from ddp_lab.course.ch01_processes import processes
from ddp_lab.course.timeline import rank_timeline

pytestmark = pytest.mark.timeout(120)
WORLD_SIZES = (1, 2, 3, 4)


def run(fn, n, *args):
    return ddp_lab.run(fn, world_size=n, args=args, timeout=60, echo=False).values


# -- pure helpers -------------------------------------------------------------------------
def test_stamped_stdout_keeps_lines_whole_and_passes_them_on():
    target = io.StringIO()
    stream = processes.StampedStdout(target)
    stream.write("a\nb")
    stream.write("c\n")
    assert [line for _, line in stream.lines] == ["a", "bc"]
    assert target.getvalue() == "a\nbc\n"


def test_write_order_merges_ranks_by_time():
    stamped = [[(1.0, "r0 first"), (4.0, "r0 last")], [(2.0, "r1"), (3.0, "r1 again")]]
    assert processes.write_order(stamped) == [(0, "r0 first"), (1, "r1"), (1, "r1 again"),
                                              (0, "r0 last")]


def test_rank_timeline_keeps_one_color_per_label_and_draws_marks():
    spans = [[("work", 10.0, 11.0), ("wait", 11.0, 12.0)], [("wait", 10.5, 12.0)]]
    ax = rank_timeline(spans, marks={"release": 11.5}, unit="s", colors={"wait": "black"}).axes[0]
    faces = [patch.get_facecolor() for patch in ax.patches]
    assert faces[1] == faces[2] == (0.0, 0.0, 0.0, 1.0) != faces[0]
    assert ax.lines[0].get_xdata()[0] == 1.5  # seconds since the earliest start


# -- ranks, groups, backends --------------------------------------------------------------
def expected_lines(rank: int, n: int) -> list[str]:
    return [f"rank: {rank}, {rank}", f"world_size: {n}, {n}"]


@pytest.mark.parametrize("n", WORLD_SIZES)
def test_printing_freely_and_in_rank_order(n):
    free = run(processes.print_freely, n)
    assert [[line for _, line in lines] for lines in free] == \
        [expected_lines(r, n) for r in range(n)]
    ordered = processes.write_order(run(processes.print_in_rank_order, n))
    assert ordered == [(r, line) for r in range(n) for line in expected_lines(r, n)]


@pytest.mark.parametrize("n", WORLD_SIZES)
def test_subgroups_sum_within_even_and_odd_ranks(n):
    ranks = torch.arange(n, dtype=torch.float32)
    for r, got in enumerate(run(processes.subgroups, n)):
        members = ranks[r % 2::2]
        assert got["group"] == ("even", "odd")[r % 2]
        assert (got["group_rank"], got["group_size"]) == (r // 2, len(members))
        assert_close(torch.tensor(got["group_sum"]), members.sum())


def test_probe_backends_agrees_with_this_torch():
    [table] = run(processes.probe_backends, 1)
    assert table["gloo"] == {"compiled": True, "works": "yes"}
    assert set(table) == {"gloo", "nccl", "mpi", "ucc", "xccl"}
    for name in ("nccl", "mpi", "ucc", "xccl"):
        available = getattr(dist, f"is_{name}_available")()
        assert table[name]["compiled"] == available
        if not available:
            assert table[name]["works"].startswith("no: ")


# -- barrier and its timeline -------------------------------------------------------------------
@pytest.mark.parametrize("n", WORLD_SIZES)
def test_no_rank_leaves_a_barrier_before_the_last_arrives(n):
    spans = run(processes.barrier_timeline, n, (0.0, 0.06, 0.03, 0.09))
    waits = processes.span_times(spans, "waiting in barrier")
    assert max(arrived for arrived, _ in waits) <= min(left for _, left in waits)
    assert [end for _, end in processes.span_times(spans, "work")] == [a for a, _ in waits]
    fig = rank_timeline(spans, marks={"release": max(a for a, _ in waits)})
    ax = fig.axes[0]
    assert [t.get_text() for t in ax.get_yticklabels()] == [f"rank {r}" for r in range(n)]
    assert len(ax.patches) == 2 * n  # a work bar and a waiting bar per rank
