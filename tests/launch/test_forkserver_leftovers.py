"""Nothing a rank starts outlives its run: helpers that moved to a session of their own and
ignore SIGTERM, multiprocessing's semaphores in /dev/shm, and a fork server that stops
answering; plus the pieces that make set-up and teardown safe against Ctrl-C."""

from __future__ import annotations

import os
import signal
import socket
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
from conftest import wait_until_gone
from ddp_lab import ForkServerUnresponsive
from ddp_lab.launch.deadlines import BOUND_SLACK_S
from ddp_lab.launch.forkserver import protocol as channel
from ddp_lab.launch.interrupts import deferred
from ddp_lab.launch.network import rendezvous
from run_probes import run_folders_of, wait_for_pids

pytestmark = pytest.mark.timeout(120)

# A helper as stubborn as they come: a session of its own, SIGTERM ignored.
STUBBORN = textwrap.dedent("""
    import os, signal, sys, time
    os.setsid()
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    open(sys.argv[1] + ".tmp", "w").write(str(os.getpid()))
    os.rename(sys.argv[1] + ".tmp", sys.argv[1])
    time.sleep(3600)
""")
# The same, started by a parent that exits at once (a daemon's double fork).
DAEMONIZED = "import os, subprocess, sys\n" \
             "subprocess.Popen([sys.executable, '-c', sys.argv[1], sys.argv[2]])\n"


def _pid_file(folder: str) -> Path:
    return Path(folder, f"helper{torch.distributed.get_rank()}.pid")


def _await(path: Path) -> None:
    while not path.exists():
        time.sleep(0.02)


def start_stubborn(folder: str, linger: float = 0.0) -> None:
    path = _pid_file(folder)
    subprocess.Popen([sys.executable, "-c", STUBBORN, str(path)])
    _await(path)
    time.sleep(linger)


def start_daemonized(folder: str) -> None:
    path = _pid_file(folder)
    subprocess.run([sys.executable, "-c", DAEMONIZED, STUBBORN, str(path)], check=True)
    _await(path)


def fork_stubborn(folder: str) -> None:
    """Forked, not exec'd: its environment names no run, only where it came from does."""
    path = _pid_file(folder)
    if os.fork() == 0:
        os.setsid()
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        path.write_text(str(os.getpid()))
        time.sleep(3600)
        os._exit(0)
    _await(path)


def helper_pids(folder: Path) -> list[int]:
    pids = [int(p.read_text()) for p in folder.glob("helper*.pid")]
    assert pids, "the ranks started no helper"
    return pids


@pytest.mark.parametrize("start", [start_stubborn, start_daemonized, fork_stubborn])
def test_a_helper_in_its_own_session_does_not_outlive_a_finished_run(tmp_path, start):
    ddp_lab.run(start, 2, args=(str(tmp_path),), echo=False)
    assert wait_until_gone(helper_pids(tmp_path), seconds=0) == []


def test_a_helper_in_its_own_session_does_not_outlive_a_timed_out_run(tmp_path):
    with pytest.raises(ddp_lab.WorkerTimeout):
        ddp_lab.run(start_stubborn, 2, args=(str(tmp_path), 3600.0), timeout=3, echo=False)
    assert wait_until_gone(helper_pids(tmp_path), seconds=0) == []


def test_a_helper_of_a_running_run_is_left_alone_until_the_run_ends(tmp_path):
    def rank1_outlives_rank0_helper(folder):
        if torch.distributed.get_rank() == 0:
            return start_daemonized(folder)  # its parent is gone at once: an orphan
        helper = Path(folder, "helper0.pid")
        _await(helper)
        time.sleep(1.5)  # rank 0 has returned by now; its helper belongs to a live run
        return psutil.pid_exists(int(helper.read_text()))

    res = ddp_lab.run(rank1_outlives_rank0_helper, 2, args=(str(tmp_path),), echo=False)
    assert res[1] is True
    assert wait_until_gone(helper_pids(tmp_path), seconds=0) == []


LAUNCHER = textwrap.dedent("""
    import sys
    sys.path[:0] = [{here!r}, {tests!r}]
    import ddp_lab, test_forkserver_leftovers
    ddp_lab.run(test_forkserver_leftovers.start_stubborn, 2, args=({folder!r}, 3600.0), timeout=600)
""")


def test_a_helper_in_its_own_session_dies_with_a_killed_launcher(tmp_path):
    here = Path(__file__).parent
    code = LAUNCHER.format(here=str(here), tests=str(here.parent), folder=str(tmp_path))
    launcher = subprocess.Popen([sys.executable, "-c", code])
    try:
        deadline = time.monotonic() + 60
        while len(list(tmp_path.glob("helper*.pid"))) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        launcher.kill()
        launcher.wait()
    assert wait_until_gone(helper_pids(tmp_path), seconds=10) == []
    assert run_folders_of(launcher.pid) == []


TORCHRUN_WORKER = textwrap.dedent("""
    import os, subprocess, sys, time
    path = os.path.join(sys.argv[1], f"helper{{os.environ['RANK']}}.pid")
    subprocess.run([sys.executable, "-c", {daemonized!r}, {stubborn!r}, path], check=True)
    while not os.path.exists(path):
        time.sleep(0.02)
""")


@pytest.mark.timeout(180)
def test_a_helper_of_a_torchrun_worker_does_not_outlive_the_run(tmp_path):
    script = tmp_path / "worker.py"
    script.write_text(TORCHRUN_WORKER.format(daemonized=DAEMONIZED, stubborn=STUBBORN))
    ddp_lab.run_script(str(script), 2, script_args=[str(tmp_path)], launcher="torchrun",
                       echo=False)
    assert wait_until_gone(helper_pids(tmp_path), seconds=0) == []


# -- multiprocessing's semaphores in /dev/shm ------------------------------------------------

def _record_semaphores(folder: str) -> None:
    """Write down every named semaphore this rank creates (multiprocessing registers each
    with its resource tracker, which unlinks the leaked ones when its pipe closes)."""
    from multiprocessing import resource_tracker
    register = resource_tracker.register
    path = Path(folder, f"sem{torch.distributed.get_rank()}.txt")

    def recording(name, rtype):
        with open(path, "a") as f:
            f.write(name + "\n")
        register(name, rtype)

    resource_tracker.register = recording


def semaphores_then_crash(folder: str, sleep: float = 0.0) -> None:
    import multiprocessing as mp
    _record_semaphores(folder)
    ctx = mp.get_context("spawn")
    kept = [ctx.Semaphore(2), ctx.Lock(), ctx.RLock()]
    time.sleep(sleep)
    raise RuntimeError(f"crashed holding {len(kept)} semaphores")


def _never_initializes():
    raise RuntimeError("this pool worker cannot start")


def pool_that_never_starts(folder: str) -> None:
    import multiprocessing as mp
    _record_semaphores(folder)
    with mp.get_context("spawn").Pool(1, initializer=_never_initializes) as pool:
        pool.map(abs, [1, 2])  # never returns: the pool replaces each failed worker


def leaked_semaphores(folder: Path) -> list[str]:
    names = [n for p in folder.glob("sem*.txt") for n in p.read_text().split()]
    assert names, "no semaphore was created"
    return [n for n in names if Path("/dev/shm", "sem." + n.lstrip("/")).exists()]


def test_semaphores_of_a_crashed_rank_are_unlinked(tmp_path):
    with pytest.raises(ddp_lab.WorkerError):
        ddp_lab.run(semaphores_then_crash, 2, args=(str(tmp_path),), echo=False)
    assert leaked_semaphores(tmp_path) == []


def test_semaphores_of_a_killed_rank_are_unlinked(tmp_path):
    with pytest.raises(ddp_lab.WorkerTimeout):
        ddp_lab.run(semaphores_then_crash, 2, args=(str(tmp_path), 3600.0), timeout=3,
                    echo=False)
    assert leaked_semaphores(tmp_path) == []


def test_semaphores_of_a_failing_spawn_pool_are_unlinked(tmp_path):
    sys.path.insert(0, str(Path(__file__).parent))  # the pool's workers import this module
    with pytest.raises(ddp_lab.WorkerTimeout):
        ddp_lab.run(pool_that_never_starts, 1, args=(str(tmp_path),), timeout=5, echo=False)
    assert leaked_semaphores(tmp_path) == []


# -- a fork server that stops answering --------------------------------------------------

@pytest.fixture
def stopped_server_is_released():
    """Whatever the launcher did, no stopped server stays behind this test."""
    pids = []
    yield pids
    for pid in pids:
        for sig in (signal.SIGKILL, signal.SIGCONT):
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass


def test_a_fork_server_stopped_mid_run_ends_the_run(tmp_path, stopped_server_is_released):
    ddp_lab.run(torch.distributed.get_rank, 1, echo=False)  # a warm server
    server = ddp_lab.launch.forkserver.client.fork_server_pid()
    stopped_server_is_released.append(server)

    def stop_when_started():
        wait_for_pids(tmp_path, 2)
        os.kill(server, signal.SIGSTOP)

    threading.Thread(target=stop_when_started, daemon=True).start()
    started = time.monotonic()
    with pytest.raises(ForkServerUnresponsive, match="stopped answering"):
        ddp_lab.run(_write_pid_and_sleep, 2, args=(str(tmp_path),), timeout=3, echo=False)
    assert time.monotonic() - started < 3 + BOUND_SLACK_S  # bounded, not a speed target
    ranks = [int(p.read_text()) for p in tmp_path.glob("rank*.pid")]
    assert wait_until_gone(ranks + [server], seconds=0) == []
    assert ddp_lab.run(torch.distributed.get_rank, 2, echo=False).values == [0, 1]


def test_a_fork_server_stopped_before_the_run_ends_the_run(stopped_server_is_released):
    ddp_lab.run(torch.distributed.get_rank, 1, echo=False)
    server = ddp_lab.launch.forkserver.client.fork_server_pid()
    stopped_server_is_released.append(server)
    os.kill(server, signal.SIGSTOP)
    started = time.monotonic()
    with pytest.raises(ForkServerUnresponsive, match="while setting up the run.s rendezvous"):
        ddp_lab.run(torch.distributed.get_rank, 2, timeout=2, echo=False)
    assert time.monotonic() - started < 2 + BOUND_SLACK_S
    assert wait_until_gone([server], seconds=0) == []
    assert ddp_lab.run(torch.distributed.get_rank, 2, echo=False).values == [0, 1]


def _write_pid_and_sleep(folder: str) -> None:
    Path(folder, f"rank{torch.distributed.get_rank()}.pid").write_text(str(os.getpid()))
    time.sleep(3600)


# -- the pieces, without processes ------------------------------------------------------

def test_a_send_to_a_peer_that_reads_nothing_times_out():
    ours, theirs = channel.socket_pair()
    with ours, theirs:
        with pytest.raises(TimeoutError):
            for _ in range(10_000):  # the peer's queue holds a few; then we must not hang
                channel.send(ours, ("signal", 1, 0), timeout=0.2)


def test_an_interrupt_is_held_back_until_the_block_ends():
    steps = []
    with pytest.raises(KeyboardInterrupt):
        with deferred():
            with deferred():
                signal.raise_signal(signal.SIGINT)
                steps.append("inner")
            steps.append("outer")
        steps.append("never")
    assert steps == ["inner", "outer"]


def test_file_identity_tells_a_reused_number_apart():
    with socket.socket() as listener:
        identity = rendezvous.file_identity(listener.fileno())
        fd = os.dup(listener.fileno())
        assert rendezvous.file_identity(fd) == identity
        os.close(fd)
        assert rendezvous.file_identity(fd) is None
        reused = os.open(os.devnull, os.O_RDONLY)
        try:
            assert rendezvous.file_identity(reused) != identity
        finally:
            os.close(reused)


def open_fds() -> set[str]:
    return {f"{fd}->{os.readlink(f'/proc/self/fd/{fd}')}" for fd in os.listdir("/proc/self/fd")
            if os.path.exists(f"/proc/self/fd/{fd}")}


def interrupt_at(code, n: int):
    """A tracer that raises KeyboardInterrupt before the ``n``-th instruction of ``code``."""
    count = [0]

    def trace(frame, event, arg):
        if frame.f_code is not code:
            return None
        frame.f_trace_opcodes = True
        if event == "opcode":
            count[0] += 1
            if count[0] == n:
                raise KeyboardInterrupt
        return trace
    return trace, count


def test_store_creation_interrupted_at_any_instruction_leaks_nothing():
    """An interrupt just after TCPStore returned used to close the listener twice (and then
    raise OSError: Bad file descriptor instead of KeyboardInterrupt)."""
    import gc
    code = rendezvous.listening_store.__code__  # loopback_store is a call of it
    rendezvous.loopback_store(2)  # libuv's process-wide pipes are made once, here
    before = open_fds()
    n = 1
    while True:
        trace, count = interrupt_at(code, n)
        sys.settrace(trace)
        try:
            store, _port = rendezvous.loopback_store(2)
        except KeyboardInterrupt:
            store = None
        finally:
            sys.settrace(None)
        finished = store is not None
        del store
        if open_fds() != before:  # only a reference cycle keeps it: collect (0.2 s each)
            gc.collect()
        assert open_fds() == before, f"interrupt before instruction {n}"
        if finished:  # it ran to the end: every instruction had its turn
            break
        n += 1
    assert n > 10


def test_the_chain_of_waits_leaves_room_within_the_bound():
    """run() ends by timeout + BOUND_SLACK_S: the waits that can follow the deadline one after
    the other must leave time for the work between them (killing, removing the folder)."""
    from ddp_lab.launch import deadlines as bound
    assert bound.WORST_CASE_WAITS_S <= bound.BOUND_SLACK_S - 3.0


def test_ctrl_c_while_a_tree_is_killed_never_leaves_it_frozen(monkeypatch):
    """kill_tree freezes the root (SIGSTOP) before it lists and kills the tree: a Ctrl-C in
    between must not leave a stopped process behind (a torchrun agent stayed stopped for
    hours that way); the interrupt comes once the tree is gone."""
    from ddp_lab.launch.forkserver import process_tree
    root = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    listed = process_tree.descendants

    def interrupted_while_listing(pid):
        os.kill(os.getpid(), signal.SIGINT)  # the user's Ctrl-C, just after the freeze
        return listed(pid)

    monkeypatch.setattr(process_tree, "descendants", interrupted_while_listing)
    with pytest.raises(KeyboardInterrupt):
        process_tree.kill_tree(root.pid)
    assert root.wait(timeout=10) == -signal.SIGKILL


# -- the store host: every run's store, in a child that never forks -------------------------
def _threads_of_the_fork_server(folder: str) -> int:
    """Run on rank 0 while the run holds: the fork server's threads (it forked this rank)."""
    import psutil
    return psutil.Process(os.getppid()).num_threads()


def test_the_fork_server_forks_ranks_with_no_store_thread_of_its_own():
    """fork copies only the calling thread: a store served from the fork server's threads
    could hand a rank a lock held for ever (1 run in 100 hung at start)."""
    threads = ddp_lab.run(_threads_of_the_fork_server, 2, args=("",), echo=False).values
    assert threads == [1, 1]


def test_a_killed_store_host_is_replaced_by_the_next_run():
    ddp_lab.run(torch.distributed.get_rank, 2, echo=False)
    server = psutil.Process(ddp_lab.launch.forkserver.client.fork_server_pid())
    host, = server.children()  # between runs: the store host alone
    host.kill()
    assert ddp_lab.run(torch.distributed.get_rank, 2, echo=False).values == [0, 1]
    assert wait_until_gone([host.pid], seconds=5) == []
    new_host, = server.children()
    assert new_host.pid != host.pid
