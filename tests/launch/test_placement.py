"""Where a run's ranks live (network/placement.py): each placement's answers to what a run
needs from it, and the one choice of placement when the settings are checked. No rank
starts here (the shaped network's probe runs in a scratch namespace)."""

from __future__ import annotations

import dataclasses

import pytest

from ddp_lab.launch import checks
from ddp_lab.launch.network.placement import (LOOPBACK, PRIVATE_SERVER, SHAPED_SERVER,
                                              OnLoopback, OnShapedLinks, checked_placement)
from ddp_lab.launch.network.setting import LinkPlan, Network, NetworkUnavailable
from ddp_lab.launch.network.switch import RANK_LINK

SHAPED = OnShapedLinks(Network("1gbit", rank_bandwidth={1: "200mbit"}))
# What every run asks of its placement; a new one (ranks on hosts) answers the same.
QUESTIONS = ("network", "server", "rank_netns", "interface", "allow", "run_backend",
             "link_plan", "not_built")


@pytest.mark.parametrize("placement", [LOOPBACK, SHAPED], ids=["loopback", "shaped"])
def test_every_placement_answers_what_a_run_asks(placement):
    assert all(hasattr(placement, name) for name in QUESTIONS)
    assert placement.server.prefix is not None and placement.server.name
    with pytest.raises(dataclasses.FrozenInstanceError):
        placement.network = None  # chosen once, when the settings are checked
    assert hash(placement) == hash(dataclasses.replace(placement))


def test_no_network_is_the_loopback_whatever_the_backend():
    assert checked_placement(None, 2, "auto") is LOOPBACK
    assert checked_placement(None, 2, "nccl") == OnLoopback()
    assert checks.checked_config(2).placement is LOOPBACK
    assert checks.checked_config(2).network is None  # what the course and tests read


def test_a_network_places_the_ranks_on_shaped_links():
    placement = checked_placement("200mbit", 3, "gloo")
    assert placement == OnShapedLinks(Network(bandwidth="200mbit"))
    config = checks.checked_config(3, network=Network("200mbit"))
    assert config.placement == placement and config.network == Network("200mbit")


def test_a_shaped_placement_is_checked_against_the_world_and_the_backend():
    with pytest.raises(ValueError, match="NCCL on GPUs does not go through it"):
        checked_placement("1gbit", 2, "cpu:gloo,cuda:nccl")
    with pytest.raises(ValueError, match="rank_bandwidth names ranks \\[2\\]"):
        checked_placement(Network(rank_bandwidth={2: "1gbit"}), 2, "gloo")
    with pytest.raises(TypeError, match="network must be ddp_lab.Network"):
        checked_placement({"bandwidth": "1gbit"}, 2, "gloo")


def test_the_loopback_allows_every_backend_and_launcher():
    for backend in ("gloo", "nccl", "cpu:gloo,cuda:nccl"):
        for launcher in ("ddp_lab", "torchrun"):
            LOOPBACK.allow(backend, launcher)


def test_shaped_links_allow_gloo_under_the_fork_server_only():
    SHAPED.allow("gloo")
    SHAPED.allow("auto")
    with pytest.raises(ValueError, match="backend='gloo'"):
        SHAPED.allow("nccl")
    with pytest.raises(ValueError, match="launcher='ddp_lab' only"):
        SHAPED.allow("gloo", "torchrun")


def test_the_run_backend_is_the_resolved_one_but_on_shaped_links():
    assert LOOPBACK.run_backend("cpu:gloo,cuda:nccl") == "cpu:gloo,cuda:nccl"
    assert SHAPED.run_backend("cpu:gloo,cuda:nccl") == "gloo"  # TCP: never NVLink/PCIe


def test_only_shaped_links_are_built_before_the_ranks():
    assert LOOPBACK.link_plan(4) is None
    plan = SHAPED.link_plan(3)
    assert isinstance(plan, LinkPlan)
    assert plan.rank_bits == (1e9, 2e8, 1e9) and plan.latency_s is None
    assert {"unshare", "ip", "tc"} <= dict(plan.tools).keys()


def test_each_rank_of_a_shaped_run_has_a_namespace_and_a_link_of_its_own():
    assert (LOOPBACK.rank_netns, LOOPBACK.interface) == (False, None)  # None: the loopback
    assert (SHAPED.rank_netns, SHAPED.interface) == (True, RANK_LINK)


def test_loopback_and_shaped_runs_have_fork_servers_of_their_own():
    assert LOOPBACK.server == PRIVATE_SERVER and SHAPED.server == SHAPED_SERVER
    assert PRIVATE_SERVER != SHAPED_SERVER
    other = OnShapedLinks(Network("10gbit", latency="1ms"))
    assert other.server is SHAPED.server  # every shaped run shares one switch server
    assert SHAPED_SERVER.prefix()[1:] == ("--user", "--map-root-user", "--net", "--")


def test_a_network_that_was_not_built_says_what_to_do():
    error = SHAPED.not_built("RTNETLINK answers: Operation not permitted")
    assert isinstance(error, NetworkUnavailable)
    assert "no rank was started" in str(error) and "network=None" in str(error)
    error = LOOPBACK.not_built("OSError: address in use")
    assert type(error) is RuntimeError
    assert "could not host the run's store: OSError: address in use" in str(error)
