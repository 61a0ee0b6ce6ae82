"""conftest.py's leak check still fails every kind of leak it caught before its process walk
was gated (it now runs only when a task was created since the last clean check).

A pytest run in a subprocess, with this conftest, on generated tests that each leak one
thing: a process, a process that a kept kernel started on request (the test itself starts
nothing), a stray that left our process tree but runs in one of our run folders, a
listening port, a run folder. Each must fail at teardown with the check's own message; a
test that leaks nothing must pass. What the inner tests leave is recorded and removed here.
"""

from __future__ import annotations

import inspect
import os
import signal
from pathlib import Path

import psutil
import pytest

CONFTEST = Path(__file__).with_name("conftest.py")

LEAKY_TESTS = r'''
import os, socket, subprocess, sys, tempfile, time
import pytest

RECORD = os.environ["LEAK_RECORD"]


def record(thing):
    with open(RECORD, "a") as out:
        out.write(f"{thing}\n")


def sleeper(**kwargs):
    process = subprocess.Popen(["sleep", "60"], **kwargs)
    record(process.pid)
    return process


# A kept kernel (conftest keeps a process whose command line has ipykernel_launcher) that
# starts a process when asked: the test that asks it starts nothing itself.
KERNEL = ("import subprocess, sys\n"
          "for line in sys.stdin:\n"
          "    child = subprocess.Popen(['sleep', '60'])\n"
          "    print(child.pid, flush=True)\n")


@pytest.fixture(scope="module")
def kernel():
    process = subprocess.Popen([sys.executable, "-c", KERNEL, "ipykernel_launcher"],
                               stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    yield process
    process.kill()
    process.wait()


def test_clean():
    subprocess.run(["true"], check=True)  # a process, waited for: the check runs and passes


def test_leaks_a_process():
    sleeper()


def test_a_kept_kernel_is_no_leak(kernel):
    """Its check passes with the kernel running: the next test starts with a clean check."""


def test_leaks_a_process_started_by_a_kept_kernel(kernel):
    kernel.stdin.write("go\n")
    kernel.stdin.flush()
    record(int(kernel.stdout.readline()))


# A child that moves to a session of its own, forks a grandchild in one of our run folders'
# names and exits: the grandchild is re-parented out of our process tree.
STRAY = ("import os, sys, time\n"
         "os.setsid()\n"
         "if os.fork() == 0:\n"
         "    open(sys.argv[1], 'a').write(f'{os.getpid()}\\n')\n"
         "    time.sleep(60)\n")


def test_leaks_a_stray():
    env = dict(os.environ, DDP_LAB_RUN_DIR=f"{tempfile.gettempdir()}/ddp_lab-{os.getpid()}-x")
    subprocess.run([sys.executable, "-c", STRAY, RECORD], env=env, check=True)
    deadline = time.monotonic() + 10
    while not open(RECORD).read() and time.monotonic() < deadline:
        time.sleep(0.05)  # until the grandchild has recorded itself: it is running


def test_leaks_a_run_folder():
    record(tempfile.mkdtemp(prefix=f"ddp_lab-{os.getpid()}-"))


# Last: the socket stays open until the run ends.
LISTENING = []


def test_leaks_a_listening_port():
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    LISTENING.append(server)
'''

FAILURES = {
    "test_leaks_a_process": "processes left behind",
    "test_leaks_a_process_started_by_a_kept_kernel": "processes left behind",
    "test_leaks_a_stray": "processes left behind",
    "test_leaks_a_listening_port": "ports left listening",
    "test_leaks_a_run_folder": "a ddp_lab run folder was left behind",
}


@pytest.mark.slow  # a pytest run of its own: about 15 s on 2 quiet cores
@pytest.mark.alone  # its inner run checks machine-wide leftovers: no other test may add any
@pytest.mark.timeout(180)
def test_each_kind_of_leak_fails_its_test(pytester, tmp_path, monkeypatch):
    record = tmp_path / "leaks.txt"
    record.touch()
    monkeypatch.setenv("LEAK_RECORD", str(record))
    monkeypatch.setenv("COLUMNS", "1000")  # the short summary's reasons, not cut short
    monkeypatch.setenv("DDP_LAB_TEST_LOCK", "off")  # this test holds the machine already
    monkeypatch.setenv("DDP_LAB_LEAK_GRACE_S", "1")  # these leaks never exit: no 10 s waits
    monkeypatch.setenv("PYTHONPATH", str(CONFTEST.parent))  # the modules conftest imports
    pytester.makeconftest(CONFTEST.read_text() + CLEAN_AFTER_EACH_TEST
                          + inspect.getsource(remove_recorded))
    pytester.makepyfile(test_leaky=LEAKY_TESTS)
    try:
        result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-rE", timeout=150)
    finally:
        remove_recorded(record)
    output = result.stdout.str()
    assert result.parseoutcomes().get("errors") == len(FAILURES), output
    for test, message in FAILURES.items():
        assert f"ERROR test_leaky.py::{test} - " in output, output
        assert _error_of(output, test).startswith(f"AssertionError: {message}"), output
    assert "ERROR test_leaky.py::test_clean" not in output, output


def _error_of(output: str, test: str) -> str:
    """The short summary's reason for ``test``'s error (``-rE``)."""
    line = next(line for line in output.splitlines()
                if line.startswith(f"ERROR test_leaky.py::{test} - "))
    return line.split(" - ", 1)[1]


# Each test's leak is removed once its check has run (after every fixture's teardown), so
# that the next test meets a clean machine and fails, if it does, for its own leak only.
CLEAN_AFTER_EACH_TEST = """
from pathlib import Path


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_teardown(item, nextitem):
    yield
    remove_recorded(Path(os.environ["LEAK_RECORD"]))

"""


def remove_recorded(record: Path) -> None:
    """Kill the processes and remove the folders the leaky tests recorded, then forget them."""
    import shutil  # this function also runs in the inner run's conftest
    for thing in record.read_text().split():
        if not thing.isdigit():
            shutil.rmtree(thing, ignore_errors=True)
            continue
        try:
            os.kill(int(thing), signal.SIGKILL)
            psutil.Process(int(thing)).wait(timeout=5)
        except (ProcessLookupError, psutil.Error):
            pass  # gone already, or not ours to wait for (a stray): killed is enough
    record.write_text("")
