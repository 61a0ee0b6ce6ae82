"""Shaped runs (ddp_lab.Network): the links deliver what was configured, and everything the
launcher promises holds inside the namespaces: values, live output, errors, timeouts with
stacks, interrupts, concurrent runs, nothing left behind, and clear refusals."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import psutil
import pytest
import torch

import ddp_lab
import workers
from conftest import wait_until_gone
from ddp_lab.course.links import tcp_bandwidth, tcp_latency
from ddp_lab.launch.forkserver.client import network_fork_server_pid
from ddp_lab.launch.network import setting as network

pytestmark = pytest.mark.timeout(180)
TOLERANCE = 0.15


def own_namespace() -> dict:
    """Where a rank lives: its network namespace and the interfaces it sees."""
    torch.distributed.barrier()
    devices = [line.split(":")[0].strip() for line in open("/proc/self/net/dev").readlines()[2:]]
    return {"netns": os.stat("/proc/self/ns/net").st_ino, "devices": sorted(devices),
            "master": os.environ["MASTER_ADDR"], "ifname": os.environ["GLOO_SOCKET_IFNAME"]}


@pytest.mark.parametrize("shaped, link", [
    (network.Network("200mbit"), 200e6),
    (network.Network("500mbit"), 500e6),
    (network.Network("1gbit", rank_bandwidth={1: "100mbit"}), 100e6),  # the slower end rules
])
def test_links_deliver_the_configured_bandwidth(shaped, link):
    nbytes = int(link / 8 * 0.3)  # about 0.3 s of traffic
    measured = ddp_lab.run(tcp_bandwidth, 2, args=(nbytes,), network=shaped, echo=False)[0]
    assert abs(measured / link - 1) < TOLERANCE, f"{measured / 1e6:.0f} Mbit/s on {shaped}"


def test_each_rank_has_a_link_of_its_own_and_the_usual_results(capsys):
    res = ddp_lab.run(own_namespace, 3, network="1gbit")
    assert len({v["netns"] for v in res} | {os.stat("/proc/self/ns/net").st_ino}) == 4
    assert all(v["devices"] == ["eth0", "lo"] and v["ifname"] == "eth0" for v in res)
    assert len({v["master"] for v in res}) == 1 and res[0]["master"].startswith("10.77.")
    x = torch.arange(4.0)
    summed = ddp_lab.run(workers.all_reduce_tensor, 3, args=(x,), network="1gbit")
    torch.testing.assert_close(summed[2], x * 6)
    printed = ddp_lab.run(workers.chatty, 2, args=(5,), network="1gbit")
    out = capsys.readouterr().out
    assert printed.values == [5, 5] and "[rank 1] rank=1 line=4" in out


def test_a_crash_names_its_rank_and_a_hang_shows_its_stacks():
    with pytest.raises(ddp_lab.WorkerError) as crash:
        ddp_lab.run(workers.raise_on, 3, args=(1,), network="1gbit", echo=False)
    assert crash.value.rank == 1 and set(crash.value.knock_on) == {0, 2}
    with pytest.raises(ddp_lab.WorkerTimeout) as hang:
        ddp_lab.run(workers.stuck_in_all_reduce_unless_rank0, 2, timeout=2,
                    network="1gbit", echo=False)
    assert hang.value.stuck_ranks == [0, 1]
    assert "dist.all_reduce(torch.ones(1))" in hang.value.stacks[1]


def test_an_interrupt_kills_every_rank(tmp_path):
    def interrupt_when_started():
        while len(list(tmp_path.glob("rank*.pid"))) < 2:
            time.sleep(0.05)
        os.kill(os.getpid(), signal.SIGINT)

    threading.Thread(target=interrupt_when_started, daemon=True).start()
    with pytest.raises(KeyboardInterrupt):
        ddp_lab.run(workers.write_pid_and_sleep, 2, args=(str(tmp_path),), network="1gbit",
                    echo=False)
    pids = [int(p.read_text()) for p in tmp_path.glob("rank*.pid")]
    assert wait_until_gone(pids, seconds=2.0) == []


def test_concurrent_shaped_runs_get_separate_networks():
    results = {}

    def one(name, bandwidth):
        results[name] = ddp_lab.run(tcp_bandwidth, 2, args=(int(bandwidth / 8 * 0.3),),
                                    network=network.Network(bandwidth), echo=False)[0]

    threads = [threading.Thread(target=one, args=(n, b)) for n, b in (("a", 100e6),
                                                                      ("b", 300e6))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert abs(results["a"] / 100e6 - 1) < TOLERANCE and abs(results["b"] / 300e6 - 1) < TOLERANCE


def test_nothing_is_left_in_the_switch_after_runs():
    """No bridge, no link, no listening store in the switch; no rank namespace held."""
    spaces = [v["netns"] for v in ddp_lab.run(own_namespace, 2, network="1gbit", echo=False)]
    with pytest.raises(ddp_lab.WorkerError):
        ddp_lab.run(workers.raise_on, 2, args=(0,), network="1gbit", echo=False)
    server = network_fork_server_pid()
    devices = [line.split(":")[0].strip()
               for line in Path(f"/proc/{server}/net/dev").read_text().splitlines()[2:]]
    assert devices == ["lo"]
    listening = [line for line in Path(f"/proc/{server}/net/tcp").read_text().splitlines()[1:]
                 if line.split()[3] == "0A"]  # 0A: TCP_LISTEN
    assert listening == []
    holders = [p.pid for p in psutil.process_iter() if _netns_of(p.pid) in spaces]
    assert holders == []


def _netns_of(pid: int) -> int | None:
    try:
        return os.stat(f"/proc/{pid}/ns/net").st_ino
    except OSError:
        return None


def test_run_script_gets_the_network_too(tmp_path):
    script = tmp_path / "where.py"
    script.write_text(textwrap.dedent("""
        import os, torch.distributed as dist, ddp_lab
        dist.init_process_group("gloo", init_method="env://")
        ddp_lab.report(os.environ["GLOO_SOCKET_IFNAME"] + " " + os.environ["MASTER_ADDR"])
        dist.destroy_process_group()
    """))
    res = ddp_lab.run_script(str(script), 2, network="1gbit", echo=False)
    assert all(v.startswith("eth0 10.77.") for v in res)


def test_a_missing_tool_is_named_before_any_process_starts(tmp_path, monkeypatch):
    for tool in ("unshare", "ip"):  # tc is missing
        (tmp_path / tool).symlink_to(network.find_tools()[tool])
    monkeypatch.setenv(network.PATH_VAR, str(tmp_path))
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    with pytest.raises(ddp_lab.NetworkUnavailable, match="needs tc, not found in") as info:
        ddp_lab.run(workers.rank_and_env, 2, network="1gbit", echo=False)
    assert "iproute2" in str(info.value) and network.PATH_VAR in str(info.value)
    assert {p.pid for p in psutil.Process().children(recursive=True)} <= before


DENIED = textwrap.dedent("""
    import ddp_lab
    try:
        ddp_lab.run(print, 2, network="1gbit")
    except ddp_lab.NetworkUnavailable as exc:
        print("REFUSED", exc)
""")


def test_a_kernel_without_user_namespaces_is_explained():
    """A real refusal: inside a user namespace whose limit of nested ones is 0."""
    unshare = network.find_tools()["unshare"]
    done = subprocess.run(
        [unshare, "--user", "--map-root-user", "sh", "-c",
         'echo 0 > /proc/sys/user/max_user_namespaces && exec "$0" -c "$1"',
         sys.executable, DENIED], capture_output=True, text=True, timeout=120)
    if "max_user_namespaces" in done.stderr:
        pytest.skip(f"this kernel does not let a namespace lower its limit: {done.stderr}")
    assert "REFUSED" in done.stdout, done.stdout + done.stderr
    assert "user namespace" in done.stdout and "max_user_namespaces" in done.stdout


def test_latency_is_shaped_where_netem_exists_and_refused_where_not():
    support = network.probe(tuple(sorted(network.find_tools().items())))
    shaped = network.Network("1gbit", latency="2ms")
    if not support.netem:
        with pytest.raises(ddp_lab.NetworkUnavailable, match="needs the netem qdisc"):
            ddp_lab.run(tcp_latency, 2, network=shaped, echo=False)
        assert _netem_really_missing()
        return
    one_way = ddp_lab.run(tcp_latency, 2, network=shaped, echo=False)[0]
    assert 2e-3 <= one_way < 2e-3 * (1 + TOLERANCE) + 2e-4


def _netem_really_missing() -> bool:
    """Asked of tc directly, not through the probe under test."""
    tools = network.find_tools()
    done = subprocess.run([tools["unshare"], "-Urn", tools["tc"], "qdisc", "add", "dev", "lo",
                           "root", "netem", "delay", "1ms"], capture_output=True, text=True)
    return done.returncode != 0


LAUNCHER = textwrap.dedent("""
    import sys
    sys.path.insert(0, {tests!r})
    import ddp_lab, workers
    ddp_lab.run(workers.write_pid_and_sleep, 2, args=({folder!r},), timeout=600,
                network="1gbit")
""")


def test_sigkill_of_the_launcher_takes_the_namespaces_down(tmp_path):
    from run_probes import run_folders_of, wait_for_pids
    code = LAUNCHER.format(tests=str(Path(__file__).parents[1]), folder=str(tmp_path))
    launcher = subprocess.Popen([sys.executable, "-c", code])
    try:
        pids = wait_for_pids(tmp_path, 2)
        spaces = {_netns_of(pid) for pid in pids}
        servers = [p.pid for p in psutil.Process(launcher.pid).children()]
    finally:
        launcher.kill()
        launcher.wait()
    assert wait_until_gone(pids + servers, seconds=10) == []
    assert not [p.pid for p in psutil.process_iter() if _netns_of(p.pid) in spaces]
    assert run_folders_of(launcher.pid) == []
