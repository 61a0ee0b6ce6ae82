"""Two hosts on one machine (network namespaces + a veth pair): they reach each other only
over their own addresses, a real multi-node torchrun job runs across them, and everything
is removed afterwards (namespaces, veth, /etc/netns files, processes), also on errors."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from ddp_lab.course import netns
from ddp_lab.course.ch09_torchrun import elastic, multinode

REASON = netns.namespace_support()
needs_namespaces = pytest.mark.skipif(REASON is not None, reason=f"no namespaces: {REASON}")
pytestmark = pytest.mark.timeout(180)


def _links() -> str:
    return subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout


def _assert_gone(hosts) -> None:
    names = netns.list_namespaces()
    links = _links()
    for host in hosts:
        assert host.netns not in names, f"namespace {host.netns} left behind"
        assert host.interface not in links, f"veth {host.interface} left behind"
        assert not (netns.NETNS_ETC / host.netns).exists()


def test_without_ip_there_are_no_namespaces_to_list(monkeypatch):
    """A machine without iproute2 (notebook 09's last cell ran on one): an empty list, not
    FileNotFoundError; two_hosts was skipped there, so nothing can be left."""
    monkeypatch.setenv("PATH", "/nonexistent")
    assert netns.namespace_support() is not None
    assert netns.list_namespaces() == netns.own_namespaces() == netns.remove_orphans() == []


def test_plan_fits_linux_interface_names_and_loopback_stand_in():
    hosts = netns._plan()
    assert all(len(h.interface) <= 15 for h in hosts)  # IFNAMSIZ - 1
    assert hosts[0].netns != hosts[1].netns and hosts[0].address != hosts[1].address
    assert hosts[0].command(["true"])[:3] == ["ip", "netns", "exec"]
    local = netns.loopback_hosts()[0]
    assert local.command(["true"]) == ["true"] and local.address == "127.0.0.1"


@needs_namespaces
def test_hosts_reach_each_other_by_name_and_everything_is_removed():
    with netns.two_hosts() as hosts:
        node0, node1 = hosts
        assert {node0.netns, node1.netns} <= set(netns.list_namespaces())
        listener = subprocess.Popen(node0.command(_port_check("listen", "29400")),
                                    stdout=subprocess.PIPE, text=True)
        assert "Listening" in listener.stdout.readline()
        reached = subprocess.run(node1.command(_port_check("connect", "node0", "29400")),
                                 capture_output=True, text=True, timeout=30)
        assert "succeeded" in reached.stdout
        assert listener.wait(timeout=30) == 0 and node1.address in listener.stdout.read()
        listener.stdout.close()
        # node0's loopback is its own: node1 cannot see a port node0 opens on 127.0.0.1
        alone = subprocess.run(node1.command(_port_check("connect", "127.0.0.1", "29400")),
                               capture_output=True, text=True, timeout=30)
        assert alone.returncode == 1
        sleeper = subprocess.Popen(node1.command(["sleep", "600"]))
    assert sleeper.wait(timeout=10) == -9  # killed by the cleanup
    _assert_gone(hosts)


def _port_check(*args: str) -> list[str]:
    return [sys.executable, "-m", "ddp_lab.scripts.port_check", *args]


@needs_namespaces
@pytest.mark.parametrize("error", [RuntimeError, KeyboardInterrupt])
def test_everything_is_removed_when_the_body_raises(error):
    with pytest.raises(error):
        with netns.two_hosts() as hosts:
            sleeper = subprocess.Popen(hosts[0].command(["sleep", "600"]))
            raise error("boom")
    assert sleeper.wait(timeout=10) == -9
    _assert_gone(hosts)


@needs_namespaces
def test_a_failure_half_way_through_creation_removes_what_was_made(monkeypatch):
    real_ip = netns._ip

    def ip_failing_on_addresses(*args, check=True):
        if "addr" in args:
            raise RuntimeError("simulated: `ip addr add` failed")
        return real_ip(*args, check=check)

    planned = []
    real_plan = netns._plan

    def recorded_plan():
        planned.append(real_plan())
        return planned[-1]

    monkeypatch.setattr(netns, "_ip", ip_failing_on_addresses)
    monkeypatch.setattr(netns, "_plan", recorded_plan)
    with pytest.raises(RuntimeError, match="simulated"):
        with netns.two_hosts():
            pass
    monkeypatch.setattr(netns, "_ip", real_ip)
    _assert_gone(planned[0])


@needs_namespaces
def test_namespaces_of_a_dead_process_are_removed_next_time():
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True).stdout.strip()
    name = f"{netns.NAME_PREFIX}{dead}-test-node0"
    subprocess.run(["ip", "netns", "add", name], check=True)
    assert name in netns.remove_orphans()
    assert name not in netns.list_namespaces()


@needs_namespaces
def test_two_nodes_two_workers_each_all_reduce_across_namespaces():
    with multinode.local_cluster() as cluster:
        assert cluster.separate
        run = multinode.all_reduce_across(cluster)
        hosts = cluster.hosts
    assert run.ok, run.summary()
    assert sorted(run.values) == [0, 1, 2, 3]
    assert [run.values[r]["sum"] for r in range(4)] == [6.0] * 4  # 0+1+2+3 everywhere
    by_node = {}
    for report in run.values.values():
        by_node.setdefault(report["env"]["GROUP_RANK"], set()).add(tuple(report["addresses"]))
    assert by_node == {"0": {("10.213.0.1",)}, "1": {("10.213.0.2",)}}  # two real hosts
    assert {run.values[r]["env"]["LOCAL_RANK"] for r in range(4)} == {"0", "1"}
    _assert_gone(hosts)


def test_late_node_grows_the_world_and_the_job_resumes():
    # namespaces when possible, else the loopback stand-in: the same torchrun commands
    with multinode.local_cluster() as cluster:
        grown = elastic.late_join(cluster, steps=20, step_s=0.1)
    assert grown.agents.ok, grown.agents.summary()
    assert grown.world_sizes() == [2, 4]
    assert grown.steps_done() == list(range(20))
    assert {v["world_size"] for v in grown.agents.values.values()} == {4}
    if cluster.separate:
        _assert_gone(cluster.hosts)


def test_notebook_states_the_timeouts_the_pitfall_tries_use():
    """Section 7 of notebook 09 names the tries' timeouts in prose: they are multinode's."""
    notebook = Path(__file__).resolve().parents[2] / "notebooks" / "09_torchrun_and_multinode.ipynb"
    text = " ".join("".join(cell["source"]).replace("\n", " ")
                    for cell in json.loads(notebook.read_text())["cells"]
                    if cell["cell_type"] == "markdown")
    assert f"`read_timeout={multinode.TRY_READ_TIMEOUT_S}`" in text
    assert f"`print_env.py --timeout {multinode.TRY_INIT_TIMEOUT_S}`" in text
    assert f"we stop it {multinode.TRY_GRACE_S:g} s after node1 failed" in text
