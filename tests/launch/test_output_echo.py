"""Every line a rank prints reaches ``res.logs``, whatever the echo shows, in a real Jupyter
kernel where the echo is slowest; and the echo stays inside Jupyter's IOPub rate limits,
saying so when it leaves lines out.

A kernel's echo once lost lines silently: ranks that printed fast exited while their pipes
still held output the echo had not caught up with, and the run returned without reading it
(4 ranks x 5,000 lines kept 3,027 to 4,312 lines each). Busy cores make the lag worse, so
one case runs with two busy loops alongside.
"""

from __future__ import annotations

import datetime
import subprocess
import sys
import time
from pathlib import Path

import pytest

from kernel_helpers import execute, start_kernel

pytestmark = pytest.mark.timeout(300)
TESTS = str(Path(__file__).parents[1])

# Jupyter server's defaults (ServerApp.iopub_data_rate_limit, iopub_msg_rate_limit,
# rate_limit_window): beyond them it drops the kernel's output for a while.
IOPUB_BYTES_PER_S, IOPUB_MSGS_PER_S, WINDOW_S = 1_000_000, 1000, 3.0


@pytest.fixture(scope="module")
def kernel(tmp_path_factory):
    manager, client = start_kernel(tmp_path_factory.mktemp("kernel"))
    try:
        run = execute(client, f"import sys; sys.path.insert(0, {TESTS!r}); import ddp_lab, workers")
        assert run.ok, run.reply
        yield client
    finally:
        client.stop_channels()
        manager.shutdown_kernel(now=True)


@pytest.fixture
def busy_cores():
    loops = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(2)]
    yield
    for loop in loops:
        loop.kill()
        loop.wait()


def _flood(kernel, world_size: int, lines: int, echo: bool):
    """Run ``workers.chatty`` and check res.logs in the kernel; the stream messages
    of the cell come back with their send times."""
    code = f"""
        res = ddp_lab.run(workers.chatty, {world_size}, args=({lines},), echo={echo})
        counts = [len(log.splitlines()) for log in res.logs]
        assert counts == [{lines}] * {world_size}, counts
        assert all(log.splitlines() == [f"rank={{r}} line={{i}}" for i in range({lines})]
                   for r, log in enumerate(res.logs))
        print("after the run")
    """
    return execute(kernel, code, timeout=240, keep_messages=True)


@pytest.mark.parametrize("world_size, lines", [(4, 5000), (2, 2000)])
def test_every_line_reaches_the_logs_with_the_echo_on(kernel, world_size, lines):
    run = _flood(kernel, world_size, lines, echo=True)
    assert run.ok, run.error
    assert run.printed.rstrip().endswith("after the run")
    _assert_within_iopub_limits(run.messages)
    shown = [line for line in run.printed.splitlines() if line.startswith("[rank ")]
    left_out = _left_out(run.printed)
    assert len(shown) + left_out == world_size * lines  # each line shown or counted


def test_every_line_reaches_the_logs_with_the_echo_off(kernel):
    run = _flood(kernel, 4, 5000, echo=False)
    assert run.ok, run.error
    assert "[rank" not in run.printed


def test_every_line_reaches_the_logs_on_busy_cores(kernel, busy_cores):
    run = _flood(kernel, 4, 5000, echo=True)
    assert run.ok, run.error
    _assert_within_iopub_limits(run.messages)


class _SlowTerminal:
    """A stdout that takes 50 ms per write, as a lagging front end would."""

    def __init__(self):
        self.text = []

    def write(self, text: str) -> int:
        time.sleep(0.05)
        self.text.append(text)
        return len(text)

    def flush(self) -> None:
        pass


def test_every_line_reaches_the_logs_whatever_the_echos_pace(monkeypatch):
    """Ranks print more than their pipes hold and exit while the echo lags far behind: the
    run still reads every pipe to its end."""
    import ddp_lab
    import workers
    monkeypatch.setattr(sys, "stdout", _SlowTerminal())
    res = ddp_lab.run(workers.chatty, 4, args=(5000,))
    assert [len(log.splitlines()) for log in res.logs] == [5000] * 4
    assert "".join(sys.stdout.text).count("\n") >= 4 * 5000  # and the echo showed them all


def _left_out(printed: str) -> int:
    """The sum of the echo's 'N lines not shown here' notices."""
    return sum(int(line.split()[1]) for line in printed.splitlines()
               if line.startswith("[ddp_lab] ") and "not shown here" in line)


def _assert_within_iopub_limits(messages: list[dict]) -> None:
    """No window of WINDOW_S seconds (by the kernel's own send times) holds more stream
    messages or bytes than Jupyter's server lets through."""
    sent = [(_date(m), len(m["content"]["text"].encode())) for m in messages
            if m["msg_type"] == "stream"]
    for start, _ in sent:
        window = [size for at, size in sent if 0 <= (at - start).total_seconds() < WINDOW_S]
        assert len(window) < IOPUB_MSGS_PER_S * WINDOW_S
        assert sum(window) < IOPUB_BYTES_PER_S * WINDOW_S


def _date(message: dict) -> datetime.datetime:
    date = message["header"]["date"]
    return date if isinstance(date, datetime.datetime) else datetime.datetime.fromisoformat(date)


def test_the_notebook_echo_batches_and_says_what_it_left_out(monkeypatch):
    """The notebook echo on a fake clock: one write per batch, never more than the byte
    budget allows, and a notice with the exact count of what it left out."""
    from ddp_lab.launch.output import echo
    now = [0.0]
    monkeypatch.setattr(echo.time, "monotonic", lambda: now[0])
    writes = []
    out = echo.NotebookEcho()
    monkeypatch.setattr(out, "write", writes.append)
    line = "x" * 99  # 110 bytes with its tag and newline
    for _ in range(100):  # 10 s of a rank printing 10,000 lines a second
        out.show(0, [line] * 1000)
        now[0] += 0.1
    out.close()
    assert len(writes) <= 101  # one per batch interval, and the last at close
    shown = sum(w.count(f"[rank 0] {line}\n") for w in writes)
    assert shown * 110 <= echo.ECHO_BURST_BYTES + 10 * echo.ECHO_BYTES_PER_S
    assert shown + _left_out("".join(writes)) == 100_000
    assert "".join(writes).endswith("res.logs (or err.logs) keep them (a rank's first and last "
                                     "megabytes when it prints more)\n")
