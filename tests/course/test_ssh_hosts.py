"""The ssh test bed (course/ssh_hosts): two hosts, each a network namespace running Debian's
OpenSSH server, joined to this machine by a switch. Real sshd, real ssh, real sockets: a
command reaches the host it names, the hosts reach each other and this machine reaches
them, only the session's key opens them, and nothing is left after any ending (a normal
exit, an exception, Ctrl-C, a killed ssh session, a process that left its session).
The last tests record what a process started over ssh learns when the ssh client dies or
the link drops: what an agent started with via="ssh" can rely on."""

from __future__ import annotations

import contextlib
import glob
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ddp_lab.course import netns, ssh_files, ssh_hosts
from ddp_lab.course.ssh_hosts import ssh_hosts as start_hosts
from ddp_lab.launch.forkserver.process_tree import wait_gone

REASON = ssh_hosts.ssh_support()
needs_ssh = pytest.mark.skipif(REASON is not None, reason=f"no ssh hosts: {REASON}")
pytestmark = pytest.mark.timeout(120)

# One connection, then the peer's address: "ready" once it listens.
LISTEN = ("import socket, sys\n"
          "server = socket.create_server((sys.argv[1], int(sys.argv[2])))\n"
          "print('ready', flush=True)\n"
          "print(server.accept()[1][0], flush=True)\n")
CONNECT = "import socket, sys; socket.create_connection((sys.argv[1], int(sys.argv[2])), 10)"


def _run(bed, host, script: str, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run(bed.command(host, ["sh", "-c", script]), capture_output=True,
                          text=True, timeout=60, **kwargs)


def _assert_gone(bed, pids=()) -> None:
    assert not wait_gone(list(pids)), "a process started on a host outlived the bed"
    names = netns.list_namespaces()
    links = _links()
    for name in bed.namespaces:
        assert name not in names, f"namespace {name} left behind"
        assert not (netns.NETNS_ETC / name).exists(), f"/etc/netns/{name} left behind"
    assert bed.cable not in links, f"cable {bed.cable} left behind"
    assert not bed.folder.exists(), f"{bed.folder} left behind"


def _links() -> str:
    """The interfaces of this machine's namespace (``ip -o link``)."""
    return subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout


def _wait_for(what, seconds: float = 20.0):
    """What ``what()`` returns once it is truthy (polled; a bounded wait, not a timing)."""
    deadline = time.monotonic() + seconds
    while not (found := what()) and time.monotonic() < deadline:
        time.sleep(0.05)
    return found


def _running(bed, host, argv: list[str]) -> list[int]:
    """Pids on ``host`` whose command line is exactly ``argv``."""
    inode = (netns.NETNS_RUN / bed.host(host).netns).stat().st_ino
    found = []
    for pid in netns.pids_in(inode):
        try:
            if Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[:-1] == [
                    a.encode() for a in argv]:
                found.append(pid)
        except OSError:
            pass  # gone meanwhile
    return found


def _sessions(bed, host) -> list[int]:
    """sshd's processes that serve a login on ``host`` (named ``sshd: USER@TTY`` or
    ``sshd: USER [priv]``; the listening one is ``sshd: /usr/sbin/sshd ...``)."""
    inode = (netns.NETNS_RUN / bed.host(host).netns).stat().st_ino
    found = []
    for pid in netns.pids_in(inode):
        try:
            title = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            continue  # gone meanwhile
        if title.startswith(b"sshd: ") and not title.startswith(b"sshd: /"):
            found.append(pid)
    return found


def _listen(bed, host, port: int) -> subprocess.Popen:
    listener = subprocess.Popen(bed.command(host, [sys.executable, "-c", LISTEN,
                                                   bed.host(host).address, str(port)]),
                                stdout=subprocess.PIPE, text=True)
    assert listener.stdout.readline().strip() == "ready"
    return listener


def _peer(listener: subprocess.Popen) -> str:
    peer = listener.stdout.readline().strip()
    assert listener.wait(timeout=30) == 0
    listener.stdout.close()
    return peer


def test_missing_sshd_root_or_a_bad_count_is_said_before_anything_is_made(monkeypatch):
    before = netns.list_namespaces(), glob.glob(f"/run/{ssh_hosts.FOLDER_PREFIX}*")
    monkeypatch.setattr(netns, "namespace_support", lambda: None)
    monkeypatch.setattr(ssh_files, "SSHD", Path("/nonexistent/sshd"))
    with pytest.raises(RuntimeError, match="apt-get install openssh-server"):
        with start_hosts():
            pass
    monkeypatch.undo()
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    with pytest.raises(RuntimeError, match="needs root"):
        with start_hosts():
            pass
    monkeypatch.undo()
    with pytest.raises(ValueError, match="1 to 9 hosts"):
        with start_hosts(0):
            pass
    assert (netns.list_namespaces(), glob.glob(f"/run/{ssh_hosts.FOLDER_PREFIX}*")) == before


@needs_ssh
def test_ssh_runs_the_command_in_each_hosts_namespace_as_this_user():
    with start_hosts() as bed:
        for host, other in zip(bed.hosts, bed.hosts[::-1]):
            done = _run(bed, host, "readlink /proc/self/ns/net; id -un; ip -o -4 addr")
            assert done.returncode == 0, done.stderr
            namespace, user, addresses = done.stdout.split("\n", 2)
            assert namespace == f"net:[{(netns.NETNS_RUN / host.netns).stat().st_ino}]"
            assert user == subprocess.run(["id", "-un"], capture_output=True,
                                          text=True).stdout.strip()
            assert f"{host.address}/24" in addresses and other.address not in addresses
        quoted = subprocess.run(bed.command("node0", ["printf", "%s|", "a b", "it's", "$HOME"]),
                                capture_output=True, text=True, timeout=60)
        assert quoted.stdout == "a b|it's|$HOME|"  # each argument arrives as it was
    _assert_gone(bed)


@needs_ssh
def test_hosts_reach_each_other_by_name_and_the_machine_reaches_both():
    with start_hosts() as bed:
        node0, node1 = bed.hosts
        listener = _listen(bed, node1, 29500)
        across = subprocess.run(bed.command(node0, [sys.executable, "-c", CONNECT,
                                                    "node1", "29500"]),
                                capture_output=True, text=True, timeout=60)
        assert across.returncode == 0, across.stderr
        assert _peer(listener) == node0.address  # straight across the switch
        for host in bed.hosts:  # from this machine's own namespace, this process
            listener = _listen(bed, host, 29501)
            socket.create_connection((host.address, 29501), timeout=10).close()
            assert _peer(listener) == bed.machine
    _assert_gone(bed)


@needs_ssh
def test_only_the_sessions_key_and_the_hosts_real_keys_are_accepted(tmp_path):
    with start_hosts() as bed:
        stranger = tmp_path / "stranger"
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(stranger)],
                       check=True)
        refused = subprocess.run(
            ["ssh", "-F", "/dev/null", "-o", "BatchMode=yes", "-o", "IdentitiesOnly=yes",
             "-o", f"UserKnownHostsFile={bed.folder / ssh_files.KNOWN_HOSTS}",
             "-i", str(stranger), f"root@{bed.hosts[0].address}", "true"],
            capture_output=True, text=True, timeout=60)
        # only publickey is offered: no password, no keyboard-interactive
        assert refused.returncode == 255 and "Permission denied (publickey)" in refused.stderr
        unknown = subprocess.run([*bed.prefix("node0")[:3], "-o", "UserKnownHostsFile=/dev/null",
                                  "node0", "true"], capture_output=True, text=True, timeout=60)
        assert unknown.returncode == 255 and "Host key verification failed" in unknown.stderr
        # sshd listens on the host's address only, not on its loopback
        loopback = _run(bed, "node0", f"{sys.executable} -c '{CONNECT}' 127.0.0.1 22")
        assert "ConnectionRefusedError" in loopback.stderr
        assert "Accepted publickey" in bed.log("node0")
    _assert_gone(bed)


@needs_ssh
@pytest.mark.parametrize("error", [None, RuntimeError, KeyboardInterrupt])
def test_a_remote_process_and_everything_else_go_however_the_body_ends(error):
    with pytest.raises(error) if error else contextlib.nullcontext():
        with start_hosts() as bed:
            client = subprocess.Popen(bed.command("node1", ["sleep", "7001"]))
            remote = _wait_for(lambda: _running(bed, "node1", ["sleep", "7001"]))
            assert remote
            if error:
                raise error("boom")
    assert client.wait(timeout=30) == 255  # its connection went with the host
    _assert_gone(bed, remote)


@needs_ssh
def test_a_session_killed_mid_command_leaves_nothing():
    with start_hosts() as bed:
        client = subprocess.Popen(bed.command("node0", ["sleep", "7002"]))
        remote = _wait_for(lambda: _running(bed, "node0", ["sleep", "7002"]))
        client.kill()
        client.wait()
    _assert_gone(bed, remote)


@needs_ssh
def test_a_process_in_a_session_of_its_own_is_killed_at_cleanup():
    with start_hosts() as bed:
        done = _run(bed, "node0", "setsid sleep 7003 </dev/null >/dev/null 2>&1 & echo $!")
        pid = int(done.stdout)
        assert os.getsid(pid) == pid  # left ssh's session: no hangup, no group kill reaches it
        assert _running(bed, "node0", ["sleep", "7003"]) == [pid]  # outlived its ssh
    _assert_gone(bed, [pid])


@needs_ssh
def test_a_failure_while_starting_removes_what_was_made(monkeypatch):
    made = []
    real_plan = ssh_hosts._plan
    monkeypatch.setattr(ssh_hosts, "_plan", lambda count: made.append(real_plan(count)) or made[-1])
    monkeypatch.setattr(ssh_files, "_sshd_config",
                        lambda folder, host, user: "NoSuchOption yes\n")
    with pytest.raises(RuntimeError, match="(?s)did not start.*NoSuchOption"):
        with start_hosts():
            pass
    _assert_gone(made[0])


@needs_ssh
def test_what_a_dead_process_left_is_removed_next_time():
    dead = int(subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                              capture_output=True, text=True).stdout)
    folder = ssh_hosts.FOLDERS / f"{ssh_hosts.FOLDER_PREFIX}{dead}-test"
    folder.mkdir(mode=0o700)
    switch = f"{netns.NAME_PREFIX}{dead}-test-switch"
    subprocess.run(["ip", "netns", "add", switch], check=True)
    ssh_hosts.remove_orphans()  # (or another test's start did, under pytest-xdist)
    assert not folder.exists() and switch not in netns.list_namespaces()


@needs_ssh
def test_a_bed_whose_process_was_killed_is_removed_by_the_next_start():
    owner = subprocess.Popen([sys.executable, "-c", (
        "import time\nfrom ddp_lab.course.ssh_hosts import ssh_hosts\n"
        "with ssh_hosts() as bed:\n"
        "    print(bed.folder, bed.cable, *bed.namespaces, flush=True)\n"
        "    time.sleep(600)\n")], stdout=subprocess.PIPE, text=True)
    folder, cable, *names = owner.stdout.readline().split()
    servers = [pid for name in names
               for pid in netns.pids_in((netns.NETNS_RUN / name).stat().st_ino)]
    assert servers  # the sshds, left running when their owner dies
    owner.kill()
    owner.wait()
    owner.stdout.close()
    ssh_hosts.remove_orphans()  # (or another test's start did, under pytest-xdist)
    assert not wait_gone(servers)
    assert _wait_for(lambda: cable not in _links() and not Path(folder).exists())
    assert not set(names) & set(netns.list_namespaces())


# What a process started over ssh learns when the controller's side goes away. An agent
# started with via="ssh" is such a process: these decide what it may rely on.

@needs_ssh
@pytest.mark.parametrize("options, remote, dies", [
    ([], "sleep 7004", False),       # no tty: sshd closes pipes nobody reads; sleep lives on
    (["-tt"], "sleep 7004", True),   # a tty: its hangup (SIGHUP) ends the session's leader
    ([], "sleep 7004 & pid=$!; cat >/dev/null; kill $pid", True),  # stdin's end, watched
], ids=["plain", "tty", "stdin-watcher"])
def test_a_killed_ssh_client_ends_the_remote_command_only_with_a_tty_or_a_watcher(
        options, remote, dies):
    with start_hosts() as bed:
        stdin_read, stdin_write = os.pipe()  # held open, as a controller holds it
        client = subprocess.Popen([*bed.prefix("node0")[:3], *options, "node0", remote],
                                  stdin=stdin_read, stdout=subprocess.DEVNULL,
                                  stderr=subprocess.DEVNULL)
        os.close(stdin_read)
        sleeper = _wait_for(lambda: _running(bed, "node0", ["sleep", "7004"]))
        assert _wait_for(lambda: _sessions(bed, "node0"))
        client.kill()
        client.wait()
        assert _wait_for(lambda: not _sessions(bed, "node0"))  # sshd saw it go
        assert bool(wait_gone(sleeper, 10.0 if dies else 1.0)) is not dies
        os.close(stdin_write)
    _assert_gone(bed, sleeper)


@needs_ssh
def test_a_cut_link_kills_the_client_but_the_host_never_hears_of_it():
    """ServerAliveInterval ends the local ssh when the link drops; the host's side sees
    nothing (a stock sshd sends no keepalives: ClientAliveInterval 0), so its stdin stays
    open and even a stdin watcher lives on: an agent needs a heartbeat of its own."""
    with start_hosts() as bed:
        stdin_read, stdin_write = os.pipe()
        client = subprocess.Popen(
            [*bed.prefix("node0")[:3], "-o", "ServerAliveInterval=1", "-o",
             "ServerAliveCountMax=2", "node0", "sleep 7005 & pid=$!; cat >/dev/null; kill $pid"],
            stdin=stdin_read, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        os.close(stdin_read)
        sleeper = _wait_for(lambda: _running(bed, "node0", ["sleep", "7005"]))
        subprocess.run(["ip", "link", "set", bed.cable, "down"], check=True)
        assert client.wait(timeout=60) == 255
        assert _running(bed, "node0", ["sleep", "7005"]) == sleeper
        assert _sessions(bed, "node0")  # sshd still serves the dead client
        os.close(stdin_write)
    _assert_gone(bed, sleeper)
