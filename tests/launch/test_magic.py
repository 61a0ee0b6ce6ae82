"""%%ddp in a real kernel: values back, variables pushed, errors at the cell's line,
progress in place, interrupts, and usage errors before any process starts."""

from __future__ import annotations

from pathlib import Path

import psutil
import pytest

from conftest import wait_until_gone
from kernel_helpers import execute, interrupt, start_kernel

pytestmark = pytest.mark.timeout(240)


@pytest.fixture(scope="module")
def kernel(tmp_path_factory):
    manager, client = start_kernel(tmp_path_factory.mktemp("magic"))
    kernel_pid = manager.provisioner.process.pid
    try:
        assert execute(client, "import ddp_lab\n%load_ext ddp_lab").ok
        yield manager, client
    finally:
        helpers = [p.pid for p in psutil.Process(kernel_pid).children(recursive=True)]
        client.stop_channels()
        manager.shutdown_kernel(now=True)
        assert wait_until_gone(helpers + [kernel_pid]) == []


def test_return_and_push(kernel):
    _, client = kernel
    assert execute(client, "scale = 2.0").ok
    run = execute(client, """\
        %%ddp -n 3 --return total,me --push scale
        t = torch.tensor([float(rank)]) * scale
        dist.all_reduce(t)
        total, me = t.item(), rank
        print("total", total)
    """)
    assert run.ok, run.error
    assert "[rank 2] total 6.0" in run.printed
    check = execute(client, "assert total == [6.0, 6.0, 6.0] and me == [0, 1, 2], (total, me)")
    assert check.ok, check.error


def test_network_gives_each_rank_a_shaped_link(kernel):
    _, client = kernel
    run = execute(client, """\
        %%ddp -n 2 --network 200mbit --return where
        import os
        dist.all_reduce(torch.ones(1))
        where = os.environ["GLOO_SOCKET_IFNAME"], os.environ["MASTER_ADDR"]
    """)
    assert run.ok, run.error
    check = execute(client, "assert [w[0] for w in where] == ['eth0', 'eth0'], where\n"
                            "assert where[0][1].startswith('10.77.'), where")
    assert check.ok, check.error


def test_error_points_at_the_cell_line(kernel):
    _, client = kernel
    run = execute(client, """\
        %%ddp -n 2
        x = 1
        if rank == 1:
            raise ValueError("bad on purpose")
        dist.barrier()
    """)
    assert run.error["ename"] == "WorkerError"
    shown = "\n".join(run.error["traceback"])
    assert "rank 1 failed" in shown and 'line 3, in <module>' in shown
    assert 'raise ValueError("bad on purpose")' in shown
    assert "interactiveshell.py" not in shown  # the launcher's frames stay hidden


def test_timeout_shows_where_each_rank_waits(kernel):
    _, client = kernel
    run = execute(client, """\
        %%ddp -n 2 --timeout 2
        import time
        if rank == 0:
            time.sleep(600)
        dist.barrier()
    """)
    assert run.error["ename"] == "WorkerTimeout"
    shown = "\n".join(run.error["traceback"])
    assert "time.sleep(600)" in shown and "in barrier" in shown


def test_progress_updates_in_place_and_ends_as_a_line(kernel):
    _, client = kernel
    run = execute(client, """\
        %%ddp -n 2
        import time, ddp_lab
        for step in ddp_lab.progress(range(20), desc="train"):
            time.sleep(0.05)
    """)
    assert run.ok, run.error
    assert any("[rank 0] train:" in d for d in run.displays)
    assert "[rank 0] train: 100%" in run.printed
    assert "[rank 1] train" not in run.printed + "".join(run.displays)  # rank 0 only


@pytest.mark.parametrize("cell, words", [
    ("%%ddp --bogus\npass", "unrecognized arguments: --bogus"),
    ("%%ddp -n two\npass", "invalid int value"),
    ("%%ddp --push not_defined_here\npass", "not_defined_here not defined"),
    ("%%ddp -n 0\npass", "world_size must be at least 1"),
    ("%%ddp --network fast\npass", "bandwidth='fast' is not understood"),
])
def test_usage_errors(kernel, cell, words):
    _, client = kernel
    run = execute(client, cell)
    shown = run.printed + "\n".join((run.error or {}).get("traceback", []))
    assert words in shown


def test_usage_error_reads_once_and_points_at_help(kernel):
    _, client = kernel
    run = execute(client, "%%ddp --bogus\npass")
    shown = run.printed + "\n".join((run.error or {}).get("traceback", []))
    assert "Usage: %%ddp [-h]" in shown and "Usage: usage:" not in shown
    assert "%%ddp --help" in shown


def test_help_prints_the_options_and_runs_nothing(kernel):
    _, client = kernel
    run = execute(client, "%%ddp --help\nraise SystemExit('the cell must not run')")
    assert run.ok, run.error
    assert "--push NAME[,NAME]" in run.printed and "--return NAME[,NAME]" in run.printed


@pytest.mark.parametrize("setup, cell, advice", [
    ("offset = 3.0", "y = offset + rank", "add --push offset to the %%ddp line"),
    ("import math", "y = math.sqrt(rank)", "import it inside the %%ddp cell"),
    ("", "y = never_defined_anywhere", "import or define anything else inside the cell"),
])
def test_name_error_says_push_or_import(kernel, setup, cell, advice):
    _, client = kernel
    assert execute(client, setup).ok
    run = execute(client, f"%%ddp -n 2\n{cell}\n")
    assert run.error["ename"] == "WorkerError"
    shown = "\n".join(run.error["traceback"])
    assert "is not defined" in shown and advice in shown, shown


def test_interrupt_stops_every_rank(kernel, tmp_path):
    manager, client = kernel
    msg_id = client.execute(f"""%%ddp -n 2 --timeout 600
import os, time, pathlib
pathlib.Path({str(tmp_path)!r}, f"rank{{rank}}.pid").write_text(str(os.getpid()))
time.sleep(600)
""")
    from run_probes import wait_for_pids
    pids = wait_for_pids(Path(tmp_path), 2)
    reply = interrupt(manager, client, msg_id)
    assert reply["ename"] == "KeyboardInterrupt"
    assert wait_until_gone(pids, seconds=5) == []


def test_magic_line_parsing():
    from ddp_lab.launch.magic import names, parse_magic_line
    options = parse_magic_line("-n 3 --timeout 5 --return a,b --push x --backend gloo")
    assert (options.world_size, options.timeout, options.backend) == (3, 5.0, "gloo")
    assert names(options.returns) == ("a", "b") and names(options.push) == ("x",)
    assert parse_magic_line("").world_size == 2


@pytest.mark.parametrize("parser", ["magic_parser", "ranks_line_parser", "ranks_cell_parser"])
def test_every_magic_answers_a_bad_option_with_its_usage(parser):
    from IPython.core.error import UsageError

    from ddp_lab.launch import magic
    from ddp_lab.launch.live import magics
    parser = getattr(magic, parser, None) or getattr(magics, parser)
    prog = parser().prog
    with pytest.raises(UsageError, match=f"^{prog}: unrecognized arguments: --bogus. Usage: "
                                         f"{prog} \\[-h\\]") as caught:
        parser().parse_args(["--bogus"])
    assert str(caught.value).endswith(f"({prog} --help says more)")


def test_pushed_names_come_from_the_notebook_or_are_named_missing():
    from IPython.core.error import UsageError

    from ddp_lab.launch.live.magic_options import names, pushed_values
    assert names(" a, b,,") == ("a", "b")
    assert pushed_values("%%ranks", ("a",), {"a": 1, "b": 2}) == {"a": 1}
    with pytest.raises(UsageError, match=r"^%%ranks --push: x, y not defined in this notebook"):
        pushed_values("%%ranks", ("x", "a", "y"), {"a": 1})
