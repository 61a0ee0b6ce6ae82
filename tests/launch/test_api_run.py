"""ddp_lab.run on real processes, compared with a single-process reference."""

from __future__ import annotations

import os
import re
import stat
import threading

import pytest
import torch

import ddp_lab
import workers

pytestmark = pytest.mark.timeout(120)


def test_values_come_back_in_rank_order_with_torchrun_env():
    res = ddp_lab.run(workers.rank_and_env, world_size=3, echo=False)
    assert [v["rank"] for v in res.values] == [0, 1, 2]
    assert all(v["world"] == 3 for v in res)
    for rank, value in enumerate(res.values):
        env = value["env"]
        assert env["RANK"] == env["LOCAL_RANK"] == str(rank)
        assert env["WORLD_SIZE"] == "3" and env["MASTER_ADDR"] == "127.0.0.1"
        assert int(env["MASTER_PORT"]) > 0
    assert res[1] is res.values[1] and len(res) == 3 and res.seconds > 0


def test_ranks_share_the_cores_instead_of_oversubscribing():
    res = ddp_lab.run(workers.rank_and_env, world_size=2, echo=False)
    cores = len(os.sched_getaffinity(0))
    assert all(v["threads"] == max(1, cores // 2) for v in res)


def test_all_reduce_matches_single_process_reference():
    x = torch.arange(6, dtype=torch.float64).reshape(2, 3)
    res = ddp_lab.run(workers.all_reduce_tensor, world_size=4, args=(x,),
                      kwargs={"scale": 0.5}, echo=False)
    expected = sum(x * (r + 1) * 0.5 for r in range(4))
    for value in res.values:
        torch.testing.assert_close(value, expected)


NOTEBOOK_CELL = '''
import torch
import torch.distributed as dist
OFFSET = 10
def cell_function(k):
    t = torch.tensor([dist.get_rank() + OFFSET + k])
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return t.item()
'''


def notebook_function():
    """A function as a notebook defines it: in a __main__ that the ranks cannot import."""
    namespace = {"__name__": "__main__"}
    exec(compile(NOTEBOOK_CELL, "<notebook cell>", "exec"), namespace)
    return namespace["cell_function"]


def test_function_defined_in_a_notebook_travels_by_value():
    res = ddp_lab.run(notebook_function(), world_size=2, args=(1,), echo=False)
    assert res.values == [12, 12]


def test_lambda_and_closure_work_too():
    base = 5
    res = ddp_lab.run(lambda: base + torch.distributed.get_rank(), world_size=2, echo=False)
    assert res.values == [5, 6]


def test_output_is_live_tagged_and_never_mixed(capsys):
    res = ddp_lab.run(workers.chatty, world_size=4, args=(200,))
    printed = [line for line in capsys.readouterr().out.splitlines() if line.startswith("[rank")]
    assert len(printed) == 800
    for line in printed:
        match = re.fullmatch(r"\[rank (\d)\] rank=(\d) line=\d+", line)
        assert match and match[1] == match[2], f"mixed or untagged line: {line!r}"
    assert res.logs[2].splitlines()[5] == "rank=2 line=5"


def test_echo_false_keeps_output_in_logs_only(capsys):
    res = ddp_lab.run(workers.chatty, world_size=2, args=(3,), echo=False)
    assert "[rank" not in capsys.readouterr().out
    assert res.logs[1].splitlines() == [f"rank=1 line={i}" for i in range(3)]


def test_everything_listens_on_loopback_only():
    res = ddp_lab.run(workers.listening_addresses, world_size=2, echo=False)
    addresses = [a for per_rank in res.values for a in per_rank]
    assert addresses and set(addresses) == {"127.0.0.1"}


def test_concurrent_runs_from_threads_do_not_collide():
    results, errors = {}, []

    def launch(i):
        try:
            results[i] = ddp_lab.run(workers.all_reduce_tensor, world_size=2,
                                     args=(torch.ones(2) * i,), echo=False)
        except Exception as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=launch, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    for i, res in results.items():
        torch.testing.assert_close(res[0], torch.ones(2) * i * 3)
    assert sorted(results) == [0, 1, 2, 3]


def test_run_folder_is_private_and_removed():
    res = ddp_lab.run(lambda: _folder_mode(), world_size=1, echo=False)
    folder, mode = res[0]
    assert mode == 0o700
    assert not os.path.exists(folder)


def _folder_mode():
    folder = os.environ["DDP_LAB_RUN_DIR"]
    return folder, stat.S_IMODE(os.stat(folder).st_mode)


def test_single_rank_run_works():
    assert ddp_lab.run(workers.all_reduce_tensor, 1, args=(torch.ones(1),), echo=False)[0] == 1


def test_fork_server_is_reused_between_runs():
    ddp_lab.run(workers.rank_and_env, 1, echo=False)
    first = ddp_lab.launch.forkserver.client.fork_server_pid()
    ddp_lab.run(workers.rank_and_env, 1, echo=False)
    assert ddp_lab.launch.forkserver.client.fork_server_pid() == first


TWO_LAUNCHERS = """
import sys
sys.path.insert(0, {tests!r})
import torch, ddp_lab, workers
for i in range(8):
    res = ddp_lab.run(workers.all_reduce_tensor, world_size=2, args=(torch.ones(1) * i,),
                      echo=False)
    assert res[1].item() == 3 * i, res
print("ok")
"""


def test_two_launcher_processes_at_once_never_collide():
    import subprocess
    import sys
    from pathlib import Path
    code = TWO_LAUNCHERS.format(tests=str(Path(__file__).parents[1]))
    launchers = [subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, text=True) for _ in range(2)]
    outputs = [p.communicate(timeout=100) for p in launchers]
    for process, (out, err) in zip(launchers, outputs):
        assert process.returncode == 0 and out.strip() == "ok", err


def _random_draws():
    import random

    import numpy
    return torch.initial_seed(), random.random(), float(numpy.random.rand())


def test_ranks_draw_different_random_numbers_like_separate_processes():
    """Forked ranks must not inherit one generator state: under torchrun every process is
    seeded from the OS, so unseeded code must behave the same way here."""
    first = ddp_lab.run(_random_draws, world_size=2, echo=False).values
    second = ddp_lab.run(_random_draws, world_size=2, echo=False).values
    for generator in range(3):
        draws = [first[0][generator], first[1][generator], second[0][generator]]
        assert len(set(draws)) == 3, f"generator {generator} repeats across ranks or runs"
