"""Notebook 09b's section on live ranks across hosts: the chapter's helpers on the real ssh
bed (course/ssh_hosts), with ranks started through real ssh. Skipped, with the reason, where
the bed cannot start (no root, no OpenSSH server). The notebook asserts the section's
claims itself; this checks the helpers it leans on, and that they see what they say."""

from __future__ import annotations

import shlex
from contextlib import ExitStack

import pytest

import ddp_lab
from ddp_lab.course import netns, ssh_hosts
from ddp_lab.course.ch09_torchrun import hosts_demo

REASON = ssh_hosts.ssh_support()
needs_bed = pytest.mark.skipif(REASON is not None, reason=f"no ssh hosts: {REASON}")


@pytest.fixture
def bed():
    with ExitStack() as cleanup:
        started = hosts_demo.start_hosts(cleanup)
        yield started
    assert not started.folder.exists()  # the cleanup removed the bed
    assert not set(started.namespaces) & set(netns.list_namespaces())


def test_the_agents_command_line_carries_no_secret_and_names_this_python():
    fake = ssh_hosts.SshHosts((ssh_hosts.Host("node0", "10.0.0.1", "eth0", "ns0"),),
                              "10.0.0.254", "10.0.0.0/24", ssh_hosts.FOLDERS / "x", "sw", "c")
    argv = hosts_demo.agent_launch(fake)
    assert argv[:3] == ["ssh", "-F", str(fake.config)] and argv[3] == "node0"
    command = shlex.split(argv[-1])
    assert command[-4:] == ["--connect", f"10.0.0.254:{hosts_demo.SHOWN_PORT}", "--index", "0"]
    assert hosts_demo.AGENT_MODULE in command
    assert not any("secret" in word.lower() or "key" in word.lower() for word in argv)


def test_start_hosts_says_why_and_gives_none_where_the_bed_cannot_start(monkeypatch, capsys):
    monkeypatch.setattr(ssh_hosts, "ssh_support", lambda: "not root (run as root)")
    with ExitStack() as cleanup:
        assert hosts_demo.start_hosts(cleanup) is None
    printed = capsys.readouterr().out
    assert "skipped" in printed and "not root (run as root)" in printed


@needs_bed
@pytest.mark.timeout(180)
def test_the_helpers_see_the_ranks_on_each_host_and_nothing_after_close(bed, capsys):
    assert hosts_demo.processes_on(bed) == {h.name: [] for h in bed.hosts}
    with ddp_lab.Ranks(4, hosts=[h.name for h in bed.hosts], nproc_per_node=2, via=bed.via,
                       controller=bed.machine) as ranks:
        running = hosts_demo.processes_on(bed)
        assert running == {h.name: ["agent", "fork server", "rank", "rank"] for h in bed.hosts}
        who = ranks.exec(hosts_demo.WHO_AM_I)
        rows = hosts_demo.rows_of(who.values, bed)
    shown = capsys.readouterr().out
    for rank in range(4):
        host = bed.hosts[rank // 2]
        assert f"[rank {rank} @{host.name}] RANK {rank} LOCAL_RANK {rank % 2}" in shown
        assert rows[rank].startswith(f"RANK {rank}  LOCAL_RANK {rank % 2}  GROUP_RANK {rank // 2}")
        assert rows[rank].endswith(f"in {host.name}'s network namespace")
    assert hosts_demo.kernel_namespace() not in hosts_demo.namespaces(bed)
    assert hosts_demo.left_on_hosts(bed) == {h.name: [] for h in bed.hosts}
