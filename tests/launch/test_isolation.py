"""Every run in a private network (launch/network/isolation.py): the ranks, the store, torchrun's
agents and workers live in a user + network namespace of their own, as their own user; on a
system that refuses user namespaces, ``auto`` warns once and falls back, ``strict`` refuses
before any rank starts, ``off`` uses the machine's network. (The attacks as another user:
test_isolation_attacks.py.)"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap

import pytest

import ddp_lab
from ddp_lab.launch.network import isolation
from ddp_lab.launch.torchrun.agents import Agent, ThisMachine, run_agents

pytestmark = pytest.mark.timeout(180)
NEEDS_NAMESPACES = pytest.mark.skipif(isolation.probe() is not None,
                                      reason=f"no private namespaces here: {isolation.probe()}")


def where_am_i() -> dict:
    """A rank's network namespace, its user and the interfaces it sees."""
    import torch.distributed as dist
    dist.barrier()
    devices = [line.split(":")[0].strip() for line in open("/proc/self/net/dev").readlines()[2:]]
    return {"netns": os.stat("/proc/self/ns/net").st_ino, "uid": os.getuid(),
            "devices": sorted(devices)}


def machine_netns() -> int:
    return os.stat("/proc/self/ns/net").st_ino


# -- the setting, without processes -----------------------------------------------------
@pytest.mark.parametrize("value, mode", [(None, "auto"), ("strict", "strict"), (" OFF ", "off")])
def test_the_setting_is_read_and_checked(value, mode):
    env = {} if value is None else {isolation.MODE_VAR: value}
    assert isolation.mode(env) == mode


def test_an_unknown_setting_says_which_values_exist():
    with pytest.raises(ValueError, match="is not one of auto, strict, off"):
        isolation.mode({isolation.MODE_VAR: "private"})


# -- private by default -----------------------------------------------------------------
@NEEDS_NAMESPACES
@pytest.mark.parametrize("live", [False, True])
def test_ranks_share_one_private_network_as_their_own_user(live):
    if live:
        with ddp_lab.Ranks(2) as ranks:
            seen = ranks.run(where_am_i).values
    else:
        seen = ddp_lab.run(where_am_i, 2, echo=False).values
    assert len({v["netns"] for v in seen}) == 1 and seen[0]["netns"] != machine_netns()
    assert all(v["uid"] == os.getuid() and v["devices"] == ["lo"] for v in seen)


WHERE_SCRIPT = textwrap.dedent("""
    import os
    import torch.distributed as dist
    import ddp_lab
    dist.init_process_group("gloo")
    dist.barrier()
    ddp_lab.report({"netns": os.stat("/proc/self/ns/net").st_ino, "uid": os.getuid()})
    dist.destroy_process_group()
""")


@NEEDS_NAMESPACES
def test_torchrun_agent_and_workers_run_in_a_private_network(tmp_path):
    script = tmp_path / "where.py"
    script.write_text(WHERE_SCRIPT)
    seen = ddp_lab.run_script(str(script), world_size=2, launcher="torchrun", echo=False)
    assert len({v["netns"] for v in seen}) == 1 and seen[0]["netns"] != machine_netns()
    assert {v["uid"] for v in seen} == {os.getuid()}


@NEEDS_NAMESPACES
def test_agents_on_this_machine_share_one_private_network_and_reach_each_other(tmp_path):
    script = tmp_path / "where.py"
    script.write_text(WHERE_SCRIPT)
    port = 29_500 + os.getpid() % 1000  # any port: the namespace is theirs alone
    args = ("--nnodes=2", "--nproc-per-node=1", "--rdzv-backend=c10d",
            f"--rdzv-endpoint=127.0.0.1:{port}", "--rdzv-id=isolation", str(script))
    result = run_agents([Agent(ThisMachine(), args), Agent(ThisMachine(), args)],
                        timeout=120, echo=False)
    assert result.ok, result.summary()
    assert len({v["netns"] for v in result.values.values()}) == 1
    assert result.values[0]["netns"] != machine_netns()


@NEEDS_NAMESPACES
def test_the_holder_of_a_shared_network_ends_with_its_stdin(tmp_path):
    holder = subprocess.Popen(isolation.helper_command("--hold"), stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "ready"
        joined = subprocess.run(
            isolation.helper_command("--join", str(holder.pid), "--", "sh", "-c",
                                     "readlink /proc/self/ns/net; pwd"),
            capture_output=True, text=True, cwd=tmp_path)
        netns, cwd = joined.stdout.split()
        assert netns == os.readlink(f"/proc/{holder.pid}/ns/net")
        assert cwd == str(tmp_path)  # joining its mount namespace keeps the working folder
    finally:
        holder.stdin.close()
        assert holder.wait(timeout=10) == 0
        holder.stdout.close()


def read_file(path: str) -> str:
    with open(path) as file:
        return file.read()


@NEEDS_NAMESPACES
@pytest.mark.skipif(os.geteuid() != 0, reason="only root can make a file of another user")
def test_roots_ranks_keep_roots_power_over_other_users_files(tmp_path):
    """root's runs get a network namespace without a user namespace: in one, the owners of
    other users' files would not be mapped, and root's ranks could not read them."""
    secret = tmp_path / "theirs.txt"
    secret.write_text("not root's")
    os.chown(secret, 12345, 12345)
    secret.chmod(0o600)
    seen = ddp_lab.run(read_file, 1, args=(str(secret),), echo=False).values
    assert seen == ["not root's"]


def test_the_isolation_setting_is_the_kernels_not_a_runs():
    with pytest.raises(ValueError, match="is this kernel's setting, not a run's"):
        ddp_lab.run(os.getpid, 1, env={isolation.MODE_VAR: "off"})


# -- a system that refuses user namespaces ------------------------------------------------
REFUSED = textwrap.dedent("""
    import os, sys, warnings
    import ddp_lab
    from ddp_lab.launch.network import isolation
    from ddp_lab.launch.forkserver.client import fork_server_pid
    sys.path.insert(0, {tests!r})
    from launch.test_isolation import where_am_i
    warnings.simplefilter("default")
    try:
        first = ddp_lab.run(where_am_i, 2, echo=False)[0]
        second = ddp_lab.run(where_am_i, 2, echo=False)[0]
    except isolation.IsolationUnavailable as exc:
        print("refused:", exc)
        print("server:", fork_server_pid())
    else:
        print("same network:", first["netns"] == os.stat("/proc/self/ns/net").st_ino)
    try:  # torchrun's store would listen on every interface: refused unless off
        ddp_lab.run_script(sys.argv[1], world_size=1, launcher="torchrun", echo=False)
        print("torchrun ran")
    except isolation.IsolationUnavailable as exc:
        print("torchrun refused:", exc)
    os.environ[isolation.MODE_VAR] = "strict"  # once a fallback server runs
    try:
        ddp_lab.run(where_am_i, 2, echo=False)
        print("strict later: ran")
    except isolation.IsolationUnavailable as exc:
        print("strict later: refused")
""")


def run_where_refused(tmp_path, mode: str) -> subprocess.CompletedProcess:
    """The kernel's code above where no private network can be made: as root without
    CAP_SYS_ADMIN (root's runs make a network namespace alone, which needs it), dropped
    from the bounding set with util-linux's setpriv."""
    if os.geteuid() != 0 or shutil.which("setpriv") is None:
        pytest.skip("needs root and util-linux's setpriv to take CAP_SYS_ADMIN away")
    script, worker = tmp_path / "kernel.py", tmp_path / "where.py"
    script.write_text(REFUSED.format(tests=os.path.dirname(os.path.dirname(__file__))))
    worker.write_text(WHERE_SCRIPT)
    return subprocess.run(["setpriv", "--bounding-set=-sys_admin", "--inh-caps=-sys_admin",
                           sys.executable, str(script), str(worker)], capture_output=True,
                          text=True, timeout=150, env={**os.environ, isolation.MODE_VAR: mode})


@NEEDS_NAMESPACES
def test_auto_warns_once_and_falls_back_where_namespaces_are_refused(tmp_path):
    done = run_where_refused(tmp_path, "auto")
    assert done.returncode == 0, done.stderr[-2000:]
    assert "same network: True" in done.stdout
    assert done.stderr.count("SharedNetworkWarning") == 1  # two runs, one warning
    assert "unshare() failed: Operation not permitted" in done.stderr
    assert "DDP_LAB_ISOLATION=strict" in done.stderr
    assert "torchrun refused:" in done.stdout and "DDP_LAB_ISOLATION=off" in done.stdout
    assert "strict later: refused" in done.stdout


@NEEDS_NAMESPACES
def test_off_runs_torchrun_on_the_machines_network_where_namespaces_are_refused(tmp_path):
    done = run_where_refused(tmp_path, "off")
    assert done.returncode == 0, done.stderr[-2000:]
    assert "same network: True" in done.stdout and "torchrun ran" in done.stdout
    assert "SharedNetworkWarning" not in done.stderr


@NEEDS_NAMESPACES
def test_strict_refuses_before_any_process_starts(tmp_path):
    done = run_where_refused(tmp_path, "strict")
    assert done.returncode == 0, done.stderr[-2000:]
    assert "refused: DDP_LAB_ISOLATION=strict" in done.stdout
    assert "unshare() failed: Operation not permitted" in done.stdout
    assert "server: None" in done.stdout  # not even the fork server was started


def test_off_uses_the_machines_network(monkeypatch):
    monkeypatch.setenv(isolation.MODE_VAR, "off")
    ddp_lab.shutdown()  # the next run starts a server with the setting
    try:
        seen = ddp_lab.run(where_am_i, 2, echo=False).values
    finally:
        monkeypatch.delenv(isolation.MODE_VAR)
        ddp_lab.shutdown()
    assert {v["netns"] for v in seen} == {machine_netns()}


def test_doctor_says_where_runs_live(monkeypatch):
    from ddp_lab.tools.doctor import isolation_fact
    expected = "private:" if isolation.probe() is None else "not private"
    assert isolation_fact().startswith(expected)
    monkeypatch.setenv(isolation.MODE_VAR, "off")
    assert "other users can reach them" in isolation_fact()
