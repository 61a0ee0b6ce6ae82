"""The grading sandbox, attacked for real: each test runs a hostile command in
``run_sandboxed`` and checks that the harm did not happen, then that nothing of the
sandbox is left (no process, mount namespace, temp folder or /dev/shm entry).

Where it matters the attack also runs with the sandbox's caller as a second, throwaway
Unix user (root creates and removes it), so that both shapes are proven: root's sandbox
(the command runs as ``nobody``) and an unprivileged user's (it runs as that user).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import psutil
import pytest

from ddp_lab.grading.sandbox import SandboxResult, run_sandboxed

pytestmark = pytest.mark.timeout(180)
PYTHON = sys.executable
GIB = 1 << 30
BUDGET = {"wall_s": 60.0, "memory_bytes": 2 * GIB, "max_processes": 64}


@pytest.fixture
def folders(tmp_path):
    """A class of two submissions: ``mine`` (the sandbox's folder) and ``theirs`` (a
    neighbour's, with a secret in it)."""
    mine, theirs = tmp_path / "mine", tmp_path / "theirs"
    mine.mkdir()
    theirs.mkdir()
    (theirs / "secret.txt").write_text("their answers")
    return mine, theirs


def python(code: str, folder: Path, **budget) -> SandboxResult:
    """``code`` run by this venv's Python in the sandbox."""
    return run_sandboxed([PYTHON, "-c", textwrap.dedent(code)], folder,
                         **{**BUDGET, **budget})


NAMESPACE_KINDS = ("user", "mnt", "pid", "net", "ipc")
SAY_NAMESPACES = ("import os; print('NS', *(os.readlink(f'/proc/self/ns/{kind}') for kind in "
                  f"{NAMESPACE_KINDS!r}), flush=True)\n")


def namespaces_in(stdout: str) -> set[str]:
    """The namespaces a command printed with SAY_NAMESPACES (its own ones)."""
    lines = [line.split()[1:] for line in stdout.splitlines() if line.startswith("NS ")]
    assert lines, f"the command did not say its namespaces: {stdout!r}"
    return set(lines[0])


def assert_namespaces_gone(names: set[str]) -> None:
    """No process of this machine is in any of these namespaces any more (they go with
    their last process; the kernel reuses no inode while one is in use)."""
    ours = {os.readlink(f"/proc/self/ns/{kind}") for kind in NAMESPACE_KINDS}
    assert not names & ours, f"the sandbox shared a namespace with its caller: {names & ours}"
    for process in psutil.process_iter():
        for kind in NAMESPACE_KINDS:
            try:
                name = os.readlink(f"/proc/{process.pid}/ns/{kind}")
            except OSError:
                continue
            assert name not in names, f"process {process.pid} is still in {name}"


@pytest.fixture(autouse=True)
def nothing_left():
    """No process of ours and no /dev/shm entry left by the test."""
    before_shm = set(os.listdir("/dev/shm"))
    yield
    children = [p for p in psutil.Process().children(recursive=True) if p.is_running()
                and p.status() != psutil.STATUS_ZOMBIE]
    assert not children, f"left behind: {children}"
    added = {name for name in set(os.listdir("/dev/shm")) - before_shm
             if name.startswith("ddp-lab-sandbox")}
    assert not added, f"/dev/shm entries left: {added}"


def test_a_command_runs_and_its_output_comes_back(folders):
    mine, _ = folders
    done = python("import sys; print('out'); print('err', file=sys.stderr); sys.exit(3)", mine)
    assert (done.returncode, done.stdout, done.stderr) == (3, "out\n", "err\n")
    assert not done.timed_out and done.reason == ""


def test_it_writes_its_folder_and_nothing_else(folders):
    mine, theirs = folders
    target = Path(__file__).resolve().parents[2] / "ddp_lab" / "__init__.py"
    before = target.read_bytes()
    done = python(f"""
        import os, pathlib
        pathlib.Path('answer.txt').write_text('mine')
        for path in ({str(target)!r}, '/etc/ddp-lab-sandbox-probe', {str(theirs / 'x')!r}):
            try:
                open(path, 'a').close()
                print('wrote', path)
            except OSError as exc:
                print('refused', path, exc.errno)
        try:
            os.remove({str(target)!r})
            print('deleted')
        except OSError as exc:
            print('not deleted', exc.errno)
        """, mine)
    assert done.returncode == 0, done.stderr
    assert "wrote" not in done.stdout and "deleted\n" not in done.stdout, done.stdout
    assert (mine / "answer.txt").read_text() == "mine"
    assert target.read_bytes() == before
    assert not (theirs / "x").exists() and not Path("/etc/ddp-lab-sandbox-probe").exists()


def test_the_other_submissions_are_out_of_sight(folders):
    mine, theirs = folders
    done = python(f"""
        import os
        print(sorted(os.listdir('..')))
        print(os.path.exists({str(theirs / 'secret.txt')!r}))
        """, mine)
    assert done.stdout.split("\n")[:2] == ["['mine']", "False"], done.stdout + done.stderr


def test_no_network_but_its_own_loopback(folders):
    mine, _ = folders
    done = python("""
        import socket
        print(sorted(name for _, name in socket.if_nameindex()))
        server = socket.create_server(('127.0.0.1', 0))
        client = socket.create_connection(server.getsockname())
        print('loopback works')
        try:
            socket.create_connection(('1.1.1.1', 53), timeout=2)
            print('reached the world')
        except OSError as exc:
            print('unreachable', exc.errno)
        """, mine)
    assert done.stdout.startswith("['lo']\nloopback works\nunreachable"), done.stdout + done.stderr


def test_a_command_past_its_wall_clock_is_killed_with_every_descendant(folders):
    mine, _ = folders
    start = time.monotonic()
    done = python(SAY_NAMESPACES + """
import os, subprocess, sys, time
# a grandchild in a session of its own, that ignores SIGTERM and outlives its parent
subprocess.Popen([sys.executable, '-c', 'import signal, time; '
                  'signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(600)'],
                 start_new_session=True)
print('started', flush=True)
time.sleep(600)
""", mine, wall_s=3.0)
    assert done.timed_out and done.returncode == -signal.SIGKILL
    assert done.reason == "ran past its 3 s budget"
    assert done.stdout.endswith("\nstarted\n")
    assert time.monotonic() - start < 15
    assert_namespaces_gone(namespaces_in(done.stdout))
