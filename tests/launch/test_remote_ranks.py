"""Live ranks on two hosts (``ddp_lab.Ranks(4, hosts=[...], nproc_per_node=2, via=...)``),
for real: the hosts are network namespaces running Debian's sshd (course/ssh_hosts), the
agents start through real ssh, the ranks meet in torch's TCPStore on the first host and
talk gloo across the switch. Each failure a local session survives is survived across hosts
with the same outcome, and nothing is left on either host after any of them: a cell that
raises, a hang, the stop button, a rank that dies, a cut link, a killed kernel, a stranger
at the controller's port."""

from __future__ import annotations

import os
import shlex
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time

import pytest

import ddp_lab
from ddp_lab.course import ssh_hosts
from ddp_lab.launch.errors import HostUnreachable, WorkerError, WorkerTimeout

REASON = ssh_hosts.ssh_support()
pytestmark = [pytest.mark.skipif(REASON is not None, reason=f"no ssh hosts: {REASON}"),
              pytest.mark.timeout(180)]
GONE_S = 20.0  # a host's ranks and agent are gone this soon after the controller is


@pytest.fixture
def bed():
    with ssh_hosts.ssh_hosts(2) as started:
        yield started


def options(bed, **more) -> dict:
    via = f"ssh -F {shlex.quote(str(bed.config))} {{host}} {{command}}"
    return dict(hosts=[h.name for h in bed.hosts], nproc_per_node=2, via=via,
                controller=bed.machine, backend="gloo", **more)


def ours_on(host) -> list[str]:
    """The processes in the host's namespace other than its sshd (ours: agents, fork
    servers, ranks, store hosts)."""
    pids = subprocess.run(["ip", "netns", "pids", host.netns], capture_output=True,
                          text=True).stdout.split()
    names = []
    for pid in pids:
        try:
            with open(f"/proc/{pid}/comm") as comm:
                names.append(comm.read().strip())
        except OSError:
            pass
    return [name for name in names if name != "sshd"]


def wait_empty(bed, seconds: float = GONE_S) -> list[list[str]]:
    until = time.monotonic() + seconds
    while (left := [ours_on(h) for h in bed.hosts]) != [[], []] and time.monotonic() < until:
        time.sleep(0.2)
    return left


def test_a_cell_runs_on_four_ranks_across_two_hosts_and_keeps_its_state(bed, capsys):
    with ddp_lab.Ranks(4, **options(bed)) as ranks:
        assert all(ours_on(h) for h in bed.hosts)  # the ranks run on both hosts
        assert repr(ranks) == ("Ranks(world_size=4, hosts=['node0', 'node1'], nproc_per_node=2, "
                               "backend='gloo', state='ready')")
        res = ranks.exec(textwrap.dedent("""\
            import os
            t = torch.ones(1) * rank
            dist.all_reduce(t)
            print("here", rank, os.environ["GLOO_SOCKET_IFNAME"])
            (t.item(), world_size, int(os.environ["LOCAL_RANK"]), int(os.environ["GROUP_RANK"]))
            """))
        assert res.values == [(6.0, 4, r % 2, r // 2) for r in range(4)]
        interfaces = {h.name: h.interface for h in bed.hosts}
        shown = capsys.readouterr().out
        for rank in range(4):
            host = bed.hosts[rank // 2]
            assert f"[rank {rank} @{host.name}] here {rank} {interfaces[host.name]}" in shown
            assert f"here {rank}" in res.logs[rank]
        ranks.push(step=3)
        assert ranks.exec("step * 2").values == [6] * 4
        assert ranks.pull("t") == [ranks.pull("t")[0]] * 4
    assert wait_empty(bed) == [[], []]


def test_an_error_on_one_host_keeps_every_rank_and_names_the_root_cause(bed):
    with ddp_lab.Ranks(4, **options(bed)) as ranks:
        with pytest.raises(WorkerError) as err:
            ranks.exec("if rank == 3:\n    raise ValueError('bad batch')\nrank")
        assert err.value.session == "kept"
        assert "rank 3 raised an exception" in str(err.value) and "bad batch" in str(err.value)
        assert ranks.pull("rank") == [0, 1, 2, 3]


def test_a_failure_on_one_host_ends_the_wait_of_the_other_hosts_ranks(bed):
    """Rank 0 raises; ranks 2 and 3 on the other host wait in a barrier for it: they get
    the local grace, then their stacks and an interrupt, long before the timeout."""
    with ddp_lab.Ranks(4, **options(bed, timeout=60)) as ranks:
        started = time.monotonic()
        with pytest.raises(WorkerError) as err:
            ranks.exec("if rank == 0:\n    raise ValueError('bad batch')\ndist.barrier()")
        assert time.monotonic() - started < 40  # far below the 60 s timeout
        assert "rank 0 raised an exception" in str(err.value)


def test_a_hang_shows_where_each_rank_waits_and_restarts_the_ranks(bed):
    with ddp_lab.Ranks(4, **options(bed, timeout=30)) as ranks:
        with pytest.raises(WorkerTimeout) as err:
            ranks.exec("dist.barrier()", on=[0, 2], timeout=3)
        text = str(err.value)
        assert err.value.session == "restart"
        assert "rank 0 was here, waiting in barrier" in text
        assert "rank 2 was here, waiting in barrier" in text
        assert ranks.state == "ready" and ranks.pull("rank") == [0, 1, 2, 3]


def test_the_stop_button_reaches_every_host(bed):
    with ddp_lab.Ranks(4, **options(bed)) as ranks:
        main = threading.main_thread().ident
        timer = threading.Timer(2.0, signal.pthread_kill, (main, signal.SIGINT))
        timer.start()
        started = time.monotonic()
        with pytest.raises(KeyboardInterrupt):
            ranks.exec("import time\ntime.sleep(60)")
        timer.join()
        assert time.monotonic() - started < 20
        assert ranks.state == "ready" and ranks.pull("rank") == [0, 1, 2, 3]  # kept


def test_a_rank_that_dies_stops_every_host_and_restart_brings_new_ones(bed):
    with ddp_lab.Ranks(4, **options(bed)) as ranks:
        with pytest.raises(WorkerError) as err:
            ranks.exec("import os\nif rank == 2:\n    os._exit(1)\ndist.barrier()")
        assert err.value.session == "stopped" and ranks.state == "stopped"
        assert "rank 2 failed (exit code 1)" in str(err.value)
        ranks.restart()
        assert ranks.pull("rank") == [0, 1, 2, 3]
    assert wait_empty(bed) == [[], []]


def test_a_cut_link_leaves_nothing_on_the_host_and_the_call_says_so(bed):
    ranks = ddp_lab.Ranks(4, **options(bed))
    lost = bed.hosts[1]
    cut = ["ip", "-n", lost.netns, "link", "set", lost.interface]
    try:
        subprocess.run([*cut, "down"], check=True)
        until = time.monotonic() + GONE_S
        while ours_on(lost) and time.monotonic() < until:
            time.sleep(0.2)
        assert ours_on(lost) == []  # its agent heard no beat and took its ranks down
        with pytest.raises(HostUnreachable) as err:
            ranks.exec("rank")
        assert err.value.session == "stopped" and ranks.state == "stopped"
        assert str(err.value).startswith(f"host {lost.name!r} (ranks 2-3) was lost during the "
                                         "call: silent for")
        with pytest.raises(RuntimeError, match="was lost"):
            ranks.exec("rank")
    finally:
        subprocess.run([*cut, "up"], check=True)
        ranks.close()
    assert wait_empty(bed) == [[], []]


def test_a_link_cut_during_a_call_ends_the_call_and_leaves_nothing(bed):
    ranks = ddp_lab.Ranks(4, **options(bed))
    lost = bed.hosts[1]
    cut = ["ip", "-n", lost.netns, "link", "set", lost.interface]
    timer = threading.Timer(1.0, subprocess.run, ([*cut, "down"],))
    try:
        timer.start()
        started = time.monotonic()
        with pytest.raises(HostUnreachable) as err:
            ranks.exec("import time\ntime.sleep(60)")
        assert time.monotonic() - started < 40  # the silence, not the call's 60 s
        assert f"host {lost.name!r} (ranks 2-3) was lost during the call" in str(err.value)
    finally:
        timer.join()
        subprocess.run([*cut, "up"], check=True)
        ranks.close()
    assert wait_empty(bed) == [[], []]


def test_silent_strangers_at_the_controllers_port_do_not_hold_the_start_up(bed):
    """Connections that say nothing each hold up only their own handshake."""
    strangers = []

    def connect_silently(address):
        strangers.extend(socket.create_connection(address, timeout=5) for _ in range(3))

    try:
        start_with_visitors(bed, connect_silently)  # before any agent can connect
    finally:
        for sock in strangers:
            sock.close()
    assert len(strangers) == 3


def start_with_visitors(bed, visit) -> None:
    """Start 4 ranks on the bed, with ``visit(address)`` called the moment the controller's
    listener exists, and check that they answer."""
    from ddp_lab.launch.remote import channel as channel_module
    original = channel_module.listener

    def spied(host, port=0):
        server = original(host, port)
        visit(server.getsockname()[:2])
        return server

    channel_module.listener = spied
    try:
        with ddp_lab.Ranks(4, **options(bed)) as ranks:
            assert ranks.pull("rank") == [0, 1, 2, 3]
    finally:
        channel_module.listener = original


def test_the_default_controller_is_found_as_ssh_finds_the_host(bed):
    """node0 is only an alias in the bed's ssh config: ``ssh -G`` says where it leads."""
    from ddp_lab.launch.remote.launchers import checked_hosts
    placement = checked_hosts([h.name for h in bed.hosts], 2, bed.via, None, 4)
    assert placement.controller == bed.machine


CONTROLLER = """\
import shlex, sys, time
import ddp_lab
ranks = ddp_lab.Ranks(4, hosts=sys.argv[1].split(","), nproc_per_node=2, backend="gloo",
                      via=sys.argv[2], controller=sys.argv[3])
ranks.exec("x = rank")
print("ready", flush=True)
time.sleep(600)
"""


def test_a_killed_kernel_leaves_nothing_on_either_host(bed, tmp_path):
    via = options(bed)["via"]
    script = tmp_path / "controller.py"
    script.write_text(CONTROLLER)
    kernel = subprocess.Popen([sys.executable, str(script), ",".join(h.name for h in bed.hosts),
                               via, bed.machine], stdout=subprocess.PIPE, text=True,
                              start_new_session=True)
    try:
        while (line := kernel.stdout.readline()) and line.strip() != "ready":
            pass  # the ranks' own lines, shown as a notebook would
        assert line.strip() == "ready"
        assert all(ours_on(h) for h in bed.hosts)
        kernel.kill()
    finally:
        kernel.kill()
        kernel.wait()
    assert wait_empty(bed) == [[], []]
    ssh_clients = subprocess.run(["pgrep", "-f", str(bed.config)], capture_output=True,
                                 text=True).stdout.split()
    assert ssh_clients == []


def test_a_stranger_at_the_controllers_port_is_refused_and_the_session_starts(bed):
    """While the agents connect, someone else on the network connects too: with garbage,
    and with a handshake under a wrong key. Neither gets in, and neither stops the start."""
    from ddp_lab.launch.remote.channel import Channel
    from ddp_lab.launch.remote.channel_errors import ChannelError
    from ddp_lab.launch.remote.handshake import AGENT
    from ddp_lab.launch.remote.secret import SessionKey
    refusals = []

    def attack(address):
        with socket.create_connection(address, timeout=5) as sock:
            sock.sendall(os.urandom(4096))
        try:
            Channel.connect(address, SessionKey.new(), AGENT, timeout=5)
        except ChannelError as exc:
            refusals.append(exc)

    attacks = []

    def visit(address):
        attacks.append(threading.Thread(target=attack, args=(address,), daemon=True))
        attacks[-1].start()

    start_with_visitors(bed, visit)
    attacks[0].join(10)
    assert len(refusals) == 1  # the wrong key refused (the garbage before it, too)


@pytest.mark.parametrize("kwargs, error, words", [
    (dict(hosts="node0"), TypeError, "list of host names"),
    (dict(hosts=["a", "a"]), ValueError, "each host once"),
    (dict(hosts=["a", "b"], nproc_per_node=3), ValueError, "make them agree"),
    (dict(hosts=["a", "b", "c"]), ValueError, "split evenly"),
    (dict(hosts=["a", "b"], via="ssh {host}"), ValueError, "{command}"),
    (dict(hosts=["a", "b"], controller="my laptop"), ValueError, "IP address"),
    (dict(hosts=["a", "b"], network="1gbit"), ValueError, "give one of the two"),
    (dict(hosts=["a", "b"], via="no-such-launcher {host} {command}"), FileNotFoundError,
     "not on this machine's PATH"),
])
def test_bad_input_is_refused_before_anything_starts(kwargs, error, words):
    with pytest.raises(error) as err:
        ddp_lab.Ranks(4, controller=kwargs.pop("controller", "127.0.0.1"), **kwargs)
    assert words in str(err.value)


def test_a_host_ssh_cannot_reach_is_named_with_what_ssh_said(bed):
    opts = options(bed)
    opts["hosts"] = [bed.hosts[0].name, "no-such-host"]
    started = time.monotonic()
    with pytest.raises(RuntimeError) as err:
        ddp_lab.Ranks(4, **opts)
    assert "'no-such-host' did not start" in str(err.value)
    assert "no-such-host" in str(err.value).split("did not start", 1)[1]  # ssh's own words
    assert time.monotonic() - started < 60
    assert wait_empty(bed) == [[], []]


@pytest.mark.parametrize("after_s", [0.3, 1.5])
def test_ctrl_c_while_the_hosts_start_leaves_nothing(bed, after_s):
    """Early (the launchers starting) or later (agents connecting, ranks starting)."""
    main = threading.main_thread().ident
    timer = threading.Timer(after_s, signal.pthread_kill, (main, signal.SIGINT))
    timer.start()
    try:
        with pytest.raises(KeyboardInterrupt):
            ddp_lab.Ranks(4, **options(bed))
            time.sleep(30)  # started before the interrupt: it lands here, then the finalizer
    finally:
        timer.cancel()
    import gc
    gc.collect()  # the Ranks of the second case (if it started) closes now
    assert wait_empty(bed) == [[], []]
    ssh_clients = subprocess.run(["pgrep", "-f", str(bed.config)], capture_output=True,
                                 text=True).stdout.split()
    assert ssh_clients == []
