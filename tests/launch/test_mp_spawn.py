"""ddp_lab.spawn runs functions written for torch.multiprocessing.spawn, published code
included; ddp_lab.run says to use it when it is handed one."""

from __future__ import annotations

import os
import socket
import threading
import time

import psutil
import pytest
import torch

import ddp_lab

pytestmark = pytest.mark.timeout(180)

# ---- https://pytorch.org/tutorials/intermediate/ddp_tutorial.html ("Basic Use Case"),
# ---- copied verbatim except: "nccl" -> "gloo", and on CPU no .to(rank) / device_ids=[rank];
# ---- demo_basic also seeds its generator and returns its parameters (marked "added").
import torch.distributed as dist
import torch.nn as nn
import torch.optim as optim

from torch.nn.parallel import DistributedDataParallel as DDP


def setup(rank, world_size):
    os.environ['MASTER_ADDR'] = 'localhost'
    os.environ['MASTER_PORT'] = '12355'

    # initialize the process group
    dist.init_process_group("gloo", rank=rank, world_size=world_size)


def cleanup():
    dist.destroy_process_group()


class ToyModel(nn.Module):
    def __init__(self):
        super(ToyModel, self).__init__()
        self.net1 = nn.Linear(10, 10)
        self.relu = nn.ReLU()
        self.net2 = nn.Linear(10, 5)

    def forward(self, x):
        return self.net2(self.relu(self.net1(x)))


def demo_basic(rank, world_size):
    print(f"Running basic DDP example on rank {rank}.")
    setup(rank, world_size)
    torch.manual_seed(rank)  # added: data the reference can reproduce

    # create model and move it to GPU with id rank
    model = ToyModel()
    ddp_model = DDP(model)

    loss_fn = nn.MSELoss()
    optimizer = optim.SGD(ddp_model.parameters(), lr=0.001)

    optimizer.zero_grad()
    outputs = ddp_model(torch.randn(20, 10))
    labels = torch.randn(20, 5)
    loss_fn(outputs, labels).backward()
    optimizer.step()

    cleanup()
    print(f"Finished running basic DDP example on rank {rank}.")
    return [p.detach().clone() for p in model.parameters()]  # added
# ---- end of the tutorial's code


def single_process_reference(world_size: int) -> list[torch.Tensor]:
    """One process, one step on every rank's batch: DDP starts from rank 0's weights
    (broadcast at construction) and averages the ranks' gradients."""
    batches = []
    for rank in range(world_size):
        torch.manual_seed(rank)
        model = ToyModel()
        batches.append((torch.randn(20, 10), torch.randn(20, 5)))
        if rank == 0:
            reference = model
    optimizer = optim.SGD(reference.parameters(), lr=0.001)
    loss = sum(nn.MSELoss()(reference(x), y) for x, y in batches) / world_size
    loss.backward()
    optimizer.step()
    return [p.detach() for p in reference.parameters()]


class PortTaken:
    """Holds 127.0.0.1:12355, the tutorial's port, as another run or program would."""

    def __enter__(self):
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            self.sock.bind(("127.0.0.1", 12355))
            self.sock.listen(8)
        except OSError:  # somebody else holds it already: the same situation
            pass
        return self

    def __exit__(self, *exc):
        self.sock.close()


@pytest.mark.parametrize("world_size", [2, 4])
def test_the_tutorials_demo_basic_matches_one_process(world_size, capsys):
    with PortTaken():
        res = ddp_lab.spawn(demo_basic, args=(world_size,), nprocs=world_size)

    expected = single_process_reference(world_size)
    for rank, params in enumerate(res.values):
        torch.testing.assert_close(params, res.values[0])
        torch.testing.assert_close(params, expected)
    out = capsys.readouterr().out
    for rank in range(world_size):
        assert f"[rank {rank}] Finished running basic DDP example on rank {rank}." in out


def tutorial_all_reduce(rank, world_size, init_method=None):
    """The tutorial's setup(), or an explicit tcp:// address on the same port."""
    if init_method is None:
        setup(rank, world_size)
    else:
        dist.init_process_group("gloo", init_method=init_method, rank=rank,
                                world_size=world_size)
    t = torch.tensor([rank + 1.0])
    dist.all_reduce(t)
    seen = os.environ.get("MASTER_PORT")
    cleanup()
    return t.item(), seen


def test_concurrent_runs_with_the_same_hard_coded_port_never_collide():
    results, errors = {}, []

    def one_run(name, extra):
        try:
            results[name] = ddp_lab.spawn(tutorial_all_reduce, args=(2, *extra), nprocs=2,
                                          echo=False, daemon=True, start_method="fork")
        except Exception as exc:  # noqa: BLE001 - reported by the assert below
            errors.append(exc)

    runs = [threading.Thread(target=one_run, args=("env", ())),
            threading.Thread(target=one_run, args=("tcp", ("tcp://localhost:12355",)))]
    with PortTaken():
        for thread in runs:
            thread.start()
        for thread in runs:
            thread.join(timeout=150)
    assert not errors, errors
    assert results["env"].values == [(3.0, "12355"), (3.0, "12355")]
    assert [v[0] for v in results["tcp"].values] == [3.0, 3.0]


def crash_on_rank_one(rank, world_size):
    setup(rank, world_size)
    if rank == 1:
        raise ValueError("rank 1 read a corrupt batch")
    dist.barrier()
    cleanup()


def hang_on_rank_one(rank, world_size):
    setup(rank, world_size)
    if rank == 1:
        time.sleep(3600)
    dist.barrier()
    cleanup()


def test_a_crash_under_spawn_names_the_rank_and_its_line():
    with pytest.raises(ddp_lab.WorkerError) as caught:
        ddp_lab.spawn(crash_on_rank_one, args=(2,), nprocs=2, echo=False)
    err = caught.value
    assert err.rank == 1 and "corrupt batch" in err.traceback
    assert "crash_on_rank_one" in err.traceback
    assert "launch/rank/pinned_rendezvous.py" not in err.traceback  # it starts at the user's code


def test_a_hang_under_spawn_times_out_with_stacks():
    with pytest.raises(ddp_lab.WorkerTimeout) as caught:
        ddp_lab.spawn(hang_on_rank_one, args=(2,), nprocs=2, timeout=5, echo=False)
    err = caught.value
    assert err.stuck_ranks == [0, 1]
    assert "barrier" in err.stacks[0] and "time.sleep(3600)" in err.stacks[1]
    assert "launch/rank/pinned_rendezvous.py" not in err.stacks[1]  # it starts at the user's code


def _children() -> set[int]:
    return {p.pid for p in psutil.Process().children(recursive=True)}


def test_run_with_an_mp_spawn_function_points_at_spawn_before_starting():
    before = _children()
    with pytest.raises(TypeError, match=r"demo_basic\(rank, world_size\).*ddp_lab\.spawn"):
        ddp_lab.run(demo_basic, world_size=2)
    with pytest.raises(TypeError, match="ddp_lab.spawn"):
        ddp_lab.run(demo_basic, world_size=2, args=(2,))
    assert _children() <= before


def initializes_its_own_group():
    dist.init_process_group("gloo")


def test_run_with_a_function_that_initializes_the_group_points_at_spawn():
    with pytest.raises(ddp_lab.WorkerError, match="twice") as caught:
        ddp_lab.run(initializes_its_own_group, world_size=2, echo=False)
    message = str(caught.value)
    assert "ddp_lab.spawn(fn, args=(world_size,), nprocs=world_size)" in message
    assert "ddp_lab.run_script" in message


def no_rank_parameter():
    return 1


@pytest.mark.parametrize("call, error, words", [
    ({"join": 60.0}, TypeError, "timeout is keyword-only"),
    ({"daemon": "yes"}, TypeError, "daemon must be True or False"),
    ({"start_method": "thread"}, ValueError, "unknown start_method"),
    ({"nprocs": 0}, ValueError, "at least 1"),
    ({"args": 2}, TypeError, r"args=\(x,\)"),
    ({"fn": no_rank_parameter}, TypeError, r"fn\(rank, \*args\)"),
    ({"args": ()}, TypeError, "missing a required argument: 'world_size'"),
])
def test_bad_spawn_input_is_rejected_before_any_process_starts(call, error, words):
    before = _children()
    call = {"fn": demo_basic, "args": (2,), **call}
    with pytest.raises(error, match=words):
        ddp_lab.spawn(call.pop("fn"), **call)
    assert _children() <= before


# ---- torch.multiprocessing.spawn's signature, and code written for it -----------------

def test_spawn_has_mp_spawns_signature_and_defaults():
    import inspect

    import torch.multiprocessing as mp
    theirs = list(inspect.signature(mp.spawn).parameters.values())
    ours = list(inspect.signature(ddp_lab.spawn).parameters.values())
    assert [(p.name, p.kind, p.default) for p in ours[:len(theirs)]] == \
        [(p.name, p.kind, p.default) for p in theirs]
    extra = ours[len(theirs):]
    assert extra[0].name == "timeout"
    assert all(p.kind is inspect.Parameter.KEYWORD_ONLY for p in extra)


def rank_and_world(rank, world_size=None):
    if world_size is not None:
        setup(rank, world_size)
        dist.barrier()
        cleanup()
    return rank


def test_spawn_positionally_as_mp_spawn_is_called():
    """``spawn(fn, args, nprocs, join)`` and the default nprocs=1, as mp.spawn takes them."""
    assert ddp_lab.spawn(rank_and_world, (2,), 2, True, echo=False).values == [0, 1]
    assert ddp_lab.spawn(rank_and_world, echo=False).values == [0]


def test_join_false_returns_a_context_to_join():
    context = ddp_lab.spawn(rank_and_world, args=(2,), nprocs=2, join=False, echo=False)
    while not context.join(timeout=0.05):
        pass
    assert context.join() is True  # joined already: True again, as mp's does
    assert context.values == [0, 1]


def test_join_false_raises_the_ranks_error_from_join():
    context = ddp_lab.spawn(crash_on_rank_one, args=(2,), nprocs=2, join=False, echo=False)
    with pytest.raises(ddp_lab.WorkerError, match="corrupt batch") as caught:
        context.join()
    assert caught.value.rank == 1


def write_pid_then_sleep(rank, folder):
    with open(os.path.join(folder, f"rank{rank}.pid"), "w") as f:
        f.write(str(os.getpid()))
    time.sleep(3600)


def test_an_interrupt_in_join_stops_every_rank_and_reraises(tmp_path):
    import signal

    from conftest import wait_until_gone

    def interrupt_when_started():
        while len(list(tmp_path.glob("rank*.pid"))) < 2:
            time.sleep(0.05)
        time.sleep(0.2)  # their pid files are written and closed
        os.kill(os.getpid(), signal.SIGINT)

    context = ddp_lab.spawn(write_pid_then_sleep, args=(str(tmp_path),), nprocs=2,
                            join=False, echo=False)
    threading.Thread(target=interrupt_when_started, daemon=True).start()
    with pytest.raises(KeyboardInterrupt):
        context.join()
    pids = [int(p.read_text()) for p in tmp_path.glob("rank*.pid")]
    assert len(pids) == 2 and wait_until_gone(pids, seconds=1.0) == []


# What a published mp.spawn script looks like (pytorch/examples' and the tutorial's shape):
# only its import line changes to run on ddp_lab, and it relies on nprocs's default too.
MP_SPAWN_SCRIPT = """
import os
import sys

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def worker(rank, world_size):
    os.environ['MASTER_ADDR'] = 'localhost'
    os.environ['MASTER_PORT'] = '12355'
    dist.init_process_group("gloo", rank=rank, world_size=world_size)
    t = torch.tensor([rank + 1.0])
    dist.all_reduce(t)
    print(f"rank {rank} of {world_size}: sum {t.item():g}")
    dist.destroy_process_group()


def alone(rank):
    print(f"alone as rank {rank}")


if __name__ == "__main__":
    world_size = int(sys.argv[1])
    mp.spawn(worker, args=(world_size,), nprocs=world_size, join=True)
    mp.spawn(alone)
    context = mp.spawn(worker, (world_size,), world_size, False)
    while not context.join():
        pass
    print("done")
"""


@pytest.mark.parametrize("import_line", ["import torch.multiprocessing as mp",
                                         "import ddp_lab as mp"])
def test_an_mp_spawn_script_runs_with_only_its_import_changed(tmp_path, import_line):
    import subprocess
    import sys
    script = tmp_path / "mp_script.py"
    source = MP_SPAWN_SCRIPT.replace("import torch.multiprocessing as mp", import_line)
    script.write_text(source)
    with PortTaken() if import_line.startswith("import ddp_lab") else _nothing():
        done = subprocess.run([sys.executable, str(script), "2"], capture_output=True,
                              text=True, timeout=150, cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.count("rank 1 of 2: sum 3") == 2, done.stdout
    assert "alone as rank 0" in done.stdout and done.stdout.rstrip().endswith("done")


class _nothing:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        pass
