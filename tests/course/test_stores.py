"""Notebook 01's init methods and stores: each init method on real ranks (world sizes 1 to
4) in fresh processes, the hand-made rendezvous on a TCPStore and a FileStore, and the pure
helpers around them (Rendezvous URLs, the loopback port, the port-race retry)."""

from __future__ import annotations

import socket

import pytest
import torch
from torch.testing import assert_close

import ddp_lab
from ddp_lab.course.ch01_processes import stores
from ddp_lab.course.ch01_processes.stores import Rendezvous
from ddp_lab.course.ports import lost_port_race

pytestmark = pytest.mark.timeout(120)
WORLD_SIZES = (1, 2, 3, 4)


def rendezvous(kind: str, folder) -> Rendezvous:
    return {"env": Rendezvous("env"), "tcp": Rendezvous("tcp", port=stores.free_loopback_port()),
            "file": Rendezvous("file", path=str(folder / "rendezvous"))}[kind]


# -- pure helpers -------------------------------------------------------------------------
def test_rendezvous_urls_and_script_args():
    cases = {Rendezvous("env"): "env://", Rendezvous("tcp", port=1234): "tcp://127.0.0.1:1234",
             Rendezvous("file", path="/x/rdv"): "file:///x/rdv"}
    for rdv, url in cases.items():
        assert rdv.url == url
        assert Rendezvous.from_args(rdv.to_args()) == rdv
    assert Rendezvous.from_args(["env"]) == Rendezvous("env")


def test_free_loopback_port_can_be_bound_on_loopback():
    port = stores.free_loopback_port()
    assert 0 < port < 2 ** 16
    with socket.socket() as s:
        s.bind(("127.0.0.1", port))


def test_a_lost_port_race_is_told_by_pythons_and_c10ds_own_messages():
    from datetime import timedelta

    from torch.distributed import DistNetworkError, TCPStore
    with socket.socket() as taken:
        taken.bind(("0.0.0.0", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with socket.socket() as second, pytest.raises(OSError) as by_python:
            second.bind(("127.0.0.1", port))
        with pytest.raises(DistNetworkError) as by_store:
            TCPStore("127.0.0.1", port, 1, is_master=True, timeout=timedelta(seconds=5),
                     wait_for_workers=False)
    assert lost_port_race(str(by_python.value)) and lost_port_race(str(by_store.value))
    assert not lost_port_race("RuntimeError: ... Connection reset by peer")


def test_retry_port_race_tries_a_new_port_after_a_lost_race():
    tried = []

    def start(rdv):
        tried.append(rdv.port)
        if len(tried) == 1:
            raise ddp_lab.WorkerError(0, 1, "OSError: [Errno 98] Address already in use", [])
        return "ran"

    assert stores.retry_port_race(Rendezvous("tcp", port=1), start) == "ran"
    assert tried[0] == 1 and tried[1] != 1


def test_retry_port_race_reraises_any_other_failure():
    def start(rdv):
        raise ddp_lab.WorkerError(0, 1, "ValueError: a real bug", [])

    with pytest.raises(ddp_lab.WorkerError, match="a real bug"):
        stores.retry_port_race(Rendezvous("tcp", port=1), start)


# -- on real ranks: each init method, then the store used directly -------------------------
@pytest.mark.parametrize("kind", ["env", "tcp", "file"])
@pytest.mark.parametrize("n", WORLD_SIZES)
def test_join_group_through_each_init_method(n, kind, tmp_path):
    rdv = rendezvous(kind, tmp_path)
    values = stores.join_in_fresh_ranks(rdv, n, echo=False).values
    reference = torch.arange(1, n + 1, dtype=torch.float32).sum()
    for rank, info in enumerate(values):
        assert (info["url"], info["rank"], info["world_size"]) == (rdv.url, rank, n)
        assert_close(torch.tensor(info["sum"]), reference)
        assert info["listening"] in ([], ["127.0.0.1"])  # loopback only
    assert values[0]["listening"] == ["127.0.0.1"]
    # (a FileStore's file is removed by the last rank's destructor: best effort, not asserted)


def test_a_port_can_serve_again_right_after_a_run():
    """Its old connections sit in TIME_WAIT; serve_store's SO_REUSEADDR lets it rebind."""
    rdv = Rendezvous("tcp", port=stores.free_loopback_port())
    for _ in range(2):
        values = stores.join_in_fresh_ranks(rdv, 2, echo=False).values
        assert {v["sum"] for v in values} == {3.0}


@pytest.mark.parametrize("kind", ["tcp", "file"])
@pytest.mark.parametrize("n", WORLD_SIZES)
def test_register_in_a_store(n, kind, tmp_path):
    values = stores.register_in_ranks(rendezvous(kind, tmp_path), n, echo=False).values
    assert sorted(v["ticket"] for v in values) == list(range(1, n + 1))
    assert {v["arrived"] for v in values} == {n}
    assert len({v["leader"] for v in values}) == 1 and 0 <= values[0]["leader"] < n
    assert all(v["roster"] == values[0]["roster"] for v in values)
    assert len(set(values[0]["roster"])) == n  # n processes, n distinct pids


def test_compare_set_returns_expected_on_an_absent_key_and_stores_nothing():
    rows = {(r["before"], r["expected"]): (r["returned"], r["stored"])
            for r in stores.compare_set_cases()}
    assert rows == {(None, ""): ("mine", "mine"), (None, "x"): ("x", None),
                    ("x", "x"): ("mine", "mine"), ("x", "z"): ("x", "x")}
