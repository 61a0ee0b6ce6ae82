"""run_script(..., launcher="torchrun"): torch's own elastic agent with ddp_lab's promises
(values, tagged output, root-cause errors, timeouts with stacks, nothing left behind);
the pieces that read torchrun's output; torchrun from Python with a restart."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time

import psutil
import pytest

import ddp_lab
from conftest import wait_until_gone
from run_probes import run_folders_of
from ddp_lab.course.ch09_torchrun import torchrun as torchrun_demo
from ddp_lab.launch.forkserver.process_tree import send, send_to_main_thread
from ddp_lab.scripts import script_path
from ddp_lab.launch.torchrun.tee import TeeDemux, last_failure

pytestmark = pytest.mark.timeout(180)


# -- pure pieces ------------------------------------------------------------------------
def test_demux_splits_the_agent_stream_per_rank_even_mid_line():
    demux = TeeDemux()
    pieces = []
    for chunk in [b"\x1e0\x1fhel", b"lo\n\x1e1\x1fbar 10%\r", b"\x1e", b"1\x1fbar 20%\n",
                  b"agent says hi\n\x1e0\x1fbye\n"]:
        pieces += demux.feed(chunk)
    per_owner: dict = {}
    for owner, text in pieces:
        per_owner[owner] = per_owner.get(owner, b"") + text
    assert per_owner == {0: b"hello\nbye\n", 1: b"bar 10%\rbar 20%\n",
                         None: b"agent says hi\n"}
    # a stray separator is text, not the start of a prefix: nothing is held back for it
    assert TeeDemux().feed(b"\x1e0\x1fa \x1e b") == [(0, b"a \x1e b")]


def test_last_failure_reads_the_last_traceback_of_a_log():
    log = textwrap.dedent("""\
        step 1
        [rank1]: Traceback (most recent call last):
        [rank1]:   File "/tmp/x.py", line 6, in <module>
        [rank1]:     raise RuntimeError("bad config")
        [rank1]: RuntimeError: bad config
        done""")
    record = last_failure(log, 12.5)
    assert (record.type_name, record.message, record.time) == ("RuntimeError", "bad config", 12.5)
    assert record.traceback.splitlines()[1] == '  File "/tmp/x.py", line 6, in <module>'
    assert last_failure("no traceback here\n", 1.0) is None


def test_unknown_launcher_is_refused_before_anything_starts():
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    with pytest.raises(ValueError, match="torchrun"):
        ddp_lab.run_script(script_path("print_env.py"), launcher="mpirun")
    assert {p.pid for p in psutil.Process().children(recursive=True)} <= before


def test_legacy_parser_breaks_on_the_new_spelling_and_print_env_takes_both():
    assert torchrun_demo.legacy_parser_on(["--local-rank=0"]).startswith("failed")
    assert torchrun_demo.legacy_parser_on(["--local_rank=0"]).startswith("parsed")
    from ddp_lab.scripts.print_env import parse_args
    assert parse_args(["--local-rank=3"]).local_rank == 3
    assert parse_args(["--local_rank=3"]).local_rank == 3


# -- real torchrun runs -----------------------------------------------------------------
def test_values_and_tagged_output_come_back_from_torchrun_workers(capsys):
    res = ddp_lab.run_script(script_path("print_env.py"), world_size=2, launcher="torchrun")
    assert [v["sum"] for v in res.values] == [1.0, 1.0]
    assert [v["env"]["RANK"] for v in res.values] == ["0", "1"]
    assert all(v["env"]["TORCHELASTIC_RUN_ID"] for v in res.values)  # torchrun's own env
    out = capsys.readouterr().out
    assert "[rank 1] rank 1 on " in out and "all_reduce sum of ranks = 1" in out
    assert "sum of ranks" in res.logs[0]


def test_crash_names_the_root_cause_with_its_traceback(tmp_path):
    script = tmp_path / "bad.py"
    script.write_text(textwrap.dedent("""
        import os, torch, torch.distributed as dist
        dist.init_process_group("gloo")
        if dist.get_rank() == 1:
            raise RuntimeError("bad config")
        dist.all_reduce(torch.ones(1))
    """))
    with pytest.raises(ddp_lab.WorkerError) as info:
        ddp_lab.run_script(script, world_size=3, launcher="torchrun", echo=False)
    err = info.value
    assert err.rank == 1 and err.exitcode == 1
    assert "RuntimeError: bad config" in err.traceback and 'bad.py", line 5' in err.traceback
    assert set(err.knock_on) == {0, 2}


def test_exit_code_of_a_rank_that_exits_without_a_traceback(tmp_path):
    script = tmp_path / "exit3.py"
    script.write_text("import os, sys\nsys.exit(3 if os.environ['RANK'] == '0' else 0)\n")
    with pytest.raises(ddp_lab.WorkerError) as info:
        ddp_lab.run_script(script, world_size=2, launcher="torchrun", echo=False)
    assert info.value.rank == 0 and info.value.exitcode == 3


def test_hang_times_out_with_each_stuck_workers_stack(tmp_path):
    """Rank 1's dump is long (threads deep in calls) and rank 0's short: rank 0 dies first,
    and torchrun's agent, were it not frozen, would stop rank 1 in the middle of its dump."""
    script = tmp_path / "hang.py"
    script.write_text(textwrap.dedent("""
        import threading, time, torch, torch.distributed as dist
        dist.init_process_group("gloo")
        def deep(depth, release):
            return deep(depth - 1, release) if depth else release.wait()
        if dist.get_rank() == 0:
            time.sleep(600)
        release = threading.Event()
        for _ in range(60):
            threading.Thread(target=deep, args=(90, release), daemon=True).start()
        dist.all_reduce(torch.ones(1))
    """))
    with pytest.raises(ddp_lab.WorkerTimeout) as info:
        ddp_lab.run_script(script, world_size=2, launcher="torchrun", timeout=25, echo=False)
    err = info.value
    assert err.stuck_ranks == [0, 1]
    assert "time.sleep(600)" in err.stacks[0] and "all_reduce" in err.stacks[1]


@pytest.mark.parametrize("sender, runs_it", [(send, "helper"), (send_to_main_thread, "<module>")])
def test_a_signal_for_the_main_thread_waits_for_it_where_another_thread_could_take_it(
        tmp_path, sender, runs_it):
    """Why the hang's SIGABRTs go to each worker's main thread: a signal sent to a process
    is run by any thread that takes it. Here the main thread blocks SIGUSR1 a moment: sent
    to the process, a helper thread runs the handler; sent to the main thread, it waits
    until the main thread takes it. faulthandler, not all threads, names the thread."""
    child = tmp_path / "two_threads.py"
    child.write_text(textwrap.dedent("""
        import faulthandler, signal, sys, threading, time
        dump = open(sys.argv[1], "w")
        faulthandler.register(signal.SIGUSR1, file=dump, all_threads=False)
        def helper():
            while True:
                time.sleep(0.01)
        threading.Thread(target=helper, daemon=True).start()
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGUSR1})
        print("blocked", flush=True)
        sys.stdin.readline()
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGUSR1})
    """))
    dump = tmp_path / "dump.txt"
    with subprocess.Popen([sys.executable, str(child), str(dump)], stdin=subprocess.PIPE,
                          stdout=subprocess.PIPE, text=True) as proc:
        assert proc.stdout.readline() == "blocked\n"
        sender(proc.pid, signal.SIGUSR1)
        if sender is send:  # taken by the helper at once, while the main thread blocks it
            deadline = time.monotonic() + 30
            while not dump.read_text() and time.monotonic() < deadline:
                time.sleep(0.02)
        proc.communicate("go\n", timeout=30)
    assert f"in {runs_it}" in dump.read_text()


def test_keyboard_interrupt_stops_agent_and_workers_and_reraises(tmp_path):
    script = tmp_path / "pid_and_sleep.py"
    script.write_text(textwrap.dedent(f"""
        import os, time
        pid_file = os.path.join({str(tmp_path)!r}, "rank" + os.environ["RANK"] + ".pid")
        open(pid_file, "w").write(str(os.getpid()))
        time.sleep(600)
    """))

    def interrupt_when_started():
        while len(list(tmp_path.glob("rank*.pid"))) < 2:
            time.sleep(0.05)
        time.sleep(0.2)
        os.kill(os.getpid(), signal.SIGINT)

    threading.Thread(target=interrupt_when_started, daemon=True).start()
    with pytest.raises(KeyboardInterrupt):
        ddp_lab.run_script(script, world_size=2, launcher="torchrun", timeout=120, echo=False)
    pids = [int(p.read_text()) for p in tmp_path.glob("rank*.pid")]
    assert wait_until_gone(pids, seconds=2.0) == []


LAUNCHER = textwrap.dedent("""
    import ddp_lab
    ddp_lab.run_script({script!r}, world_size=2, launcher="torchrun", timeout=600)
""")


def test_sigkill_of_the_launcher_takes_agent_workers_and_folder_down(tmp_path):
    script = tmp_path / "sleepy.py"
    script.write_text("import time, torch.distributed as dist\n"
                      "dist.init_process_group('gloo')\nprint('up', flush=True)\n"
                      "time.sleep(600)\n")
    launcher = subprocess.Popen([sys.executable, "-c", LAUNCHER.format(script=str(script))],
                                stdout=subprocess.PIPE, text=True)
    try:
        # a worker is running (on busy cores a "still running" heartbeat may come first)
        assert any("up" in launcher.stdout.readline() for _ in range(20))
        tree = [p.pid for p in psutil.Process(launcher.pid).children(recursive=True)]
    finally:
        launcher.kill()
        launcher.wait()
        launcher.stdout.close()
    assert len(tree) >= 3  # the agent and two workers
    assert wait_until_gone(tree, seconds=20) == []
    assert run_folders_of(launcher.pid) == []


ELASTIC_LAUNCH = textwrap.dedent("""
    import os, signal, tempfile
    from ddp_lab.course.ch09_torchrun import torchrun as demo
    if __name__ == "__main__":
        out = demo.launch_from_python(demo.flaky_all_reduce, nproc=2, max_restarts=1)
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
        # the caller's temp folder is untouched (torch's inductor would keep a folder seen
        # during the launch for good, and make it again later)
        assert tempfile.gettempdir() == os.environ["TMPDIR"]
        assert "ddp_lab-" not in os.environ.get("TORCHINDUCTOR_CACHE_DIR", "")
        print(sorted((r, v["restart"], v["sum"]) for r, v in out.values.items()))
        print(out.sigint_handler_left)
""")


def test_elastic_launch_restarts_all_workers_after_a_crash(tmp_path):
    # in a child process: multiprocessing's spawn leaves a resource tracker behind
    script = tmp_path / "launch.py"
    script.write_text(ELASTIC_LAUNCH)
    # its own temp folder, to see what the launch leaves there; deep, as macOS's TMPDIR is:
    # too deep for multiprocessing's fork-server socket ("AF_UNIX path too long")
    temp = tmp_path / ("a-temp-folder-deeper-than-a-unix-socket-path-allows-" + "x" * 20)
    temp.mkdir()
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                          timeout=150, cwd=tmp_path, env={**os.environ, "TMPDIR": str(temp)})
    assert done.returncode == 0, done.stderr[-3000:]
    left = [p.name for p in temp.iterdir() if p.name.startswith(("pytorch-errorfile", "ddp_lab-"))]
    assert left == []
    values, handler = done.stdout.strip().splitlines()[-2:]
    assert values == "[(0, 1, 1.0), (1, 1, 1.0)]"  # both restarted once, then all_reduced
    assert handler == "_terminate_process_handler"
    assert "simulated crash on attempt 0" in done.stdout  # the launch's output, live
    # torch's own failure line names how the workers were started (notebook 09 says it)
    assert "(start_method: forkserver)" in done.stdout


LOSE_THE_PORT_ONCE = textwrap.dedent("""
    from pathlib import Path

    def lose_the_port_once(marker):
        if not Path(marker).exists():  # what rank 0 raises when its port was taken first
            Path(marker).touch()
            raise RuntimeError("The server socket has failed to listen ... EADDRINUSE ...")
        if marker.endswith("bug"):
            raise ValueError("a real bug")
        return "ran"
""")

LAUNCH_IT = textwrap.dedent("""
    import sys
    from ddp_lab.course.ch09_torchrun import torchrun as demo
    from flaky import lose_the_port_once  # importable: it travels by reference

    if __name__ == "__main__":
        out = demo.launch_from_python(lose_the_port_once, sys.argv[1], nproc=1, max_restarts=0)
        print(out.values)
""")


@pytest.mark.parametrize("marker", ["first", "bug"])
def test_elastic_launch_runs_again_only_after_a_lost_port_race(tmp_path, marker):
    (tmp_path / "flaky.py").write_text(LOSE_THE_PORT_ONCE)
    script = tmp_path / "launch.py"
    script.write_text(LAUNCH_IT)
    if marker == "bug":
        (tmp_path / marker).touch()
    done = subprocess.run([sys.executable, str(script), str(tmp_path / marker)],
                          capture_output=True, text=True, timeout=150, cwd=tmp_path)
    again = "found its port taken" in done.stdout
    if marker == "first":
        assert done.returncode == 0 and again, done.stderr[-3000:]
        assert done.stdout.strip().splitlines()[-1] == "{0: 'ran'}"
    else:
        assert done.returncode != 0 and not again and "a real bug" in done.stderr
