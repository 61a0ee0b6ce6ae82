"""A rank's traceback quotes the notebook's own lines, for functions defined in a cell and
shipped by value (``run``, ``spawn``), whatever file name the pickler gives their code."""

from __future__ import annotations

import linecache
import pickle
import sys
import textwrap
from pathlib import Path

import cloudpickle
import pytest

import ddp_lab
from ddp_lab.launch.payload import dumps

pytestmark = pytest.mark.timeout(180)
TESTS = str(Path(__file__).parents[1])

# What a notebook cell holds: IPython files it in linecache under a name with no file
# behind it (ipykernel: /tmp/ipykernel_PID/HASH.py, mtime None), compiles it under that name.
CELL = textwrap.dedent("""\
    import torch
    import torch.distributed as dist

    def crash_on_rank_one(rank=None):
        rank = dist.get_rank() if rank is None else rank
        if rank == 1:
            raise ValueError("rank 1 read a corrupt batch")
        dist.barrier()

    def sleeps_on_rank_one():
        if dist.get_rank() == 1:
            import time; time.sleep(3600)
        dist.barrier()

    def spawned(rank, world_size):
        dist.init_process_group("gloo", rank=rank, world_size=world_size)
        crash_on_rank_one(rank)
        dist.destroy_process_group()
""")
RAISING_LINE = 'raise ValueError("rank 1 read a corrupt batch")'


@pytest.fixture()
def cell():
    """The cell's functions, defined as a kernel defines them (``__main__``-like module)."""
    name = "/tmp/ipykernel_0/notebook-cell-under-test.py"
    linecache.cache[name] = (len(CELL), None, CELL.splitlines(keepends=True), name)
    namespace = {"__name__": "__main__"}
    exec(compile(CELL, name, "exec"), namespace)  # noqa: S102 - the cell above
    yield namespace
    linecache.cache.pop(name, None)


def test_the_installed_cloudpickle_renames_code_shipped_by_value(cell):
    """Why payload.dumps exists: cloudpickle's own copy forgets the cell's file name."""
    fn = cell["crash_on_rank_one"]
    plain = pickle.loads(cloudpickle.dumps(fn))
    assert sys.modules.get(fn.__module__) is not None  # '__main__': shipped by value
    print("cloudpickle", cloudpickle.__version__, "names it", plain.__code__.co_filename)
    kept = pickle.loads(dumps(fn))
    assert kept.__code__.co_filename == fn.__code__.co_filename
    assert kept.__code__.co_firstlineno == fn.__code__.co_firstlineno


def test_run_quotes_the_cells_raising_line(cell):
    with pytest.raises(ddp_lab.WorkerError) as caught:
        ddp_lab.run(cell["crash_on_rank_one"], world_size=2, echo=False)
    _assert_quotes_the_cell(caught.value)


def test_spawn_quotes_the_cells_raising_line(cell):
    with pytest.raises(ddp_lab.WorkerError) as caught:
        ddp_lab.spawn(cell["spawned"], args=(2,), nprocs=2, echo=False)
    _assert_quotes_the_cell(caught.value)
    assert "crash_on_rank_one(rank)" in caught.value.traceback  # the caller's line too


def test_a_hangs_stacks_quote_the_cells_lines(cell):
    with pytest.raises(ddp_lab.WorkerTimeout) as caught:
        ddp_lab.run(cell["sleeps_on_rank_one"], world_size=2, timeout=5, echo=False)
    stacks = caught.value.stacks
    assert "import time; time.sleep(3600)" in stacks[1], stacks[1]
    assert "dist.barrier()" in stacks[0], stacks[0]


def test_live_ranks_quote_the_cells_raising_line(cell):
    with ddp_lab.Ranks(world_size=2) as ranks:
        with pytest.raises(ddp_lab.WorkerError) as caught:
            ranks.run(cell["crash_on_rank_one"])
    _assert_quotes_the_cell(caught.value)


def _assert_quotes_the_cell(err: ddp_lab.WorkerError) -> None:
    assert err.rank == 1
    assert "notebook-cell-under-test.py" in err.traceback
    assert "<dynamic-code>" not in err.traceback
    assert RAISING_LINE in err.traceback, err.traceback


# The PyTorch DDP tutorial's demo_basic (https://pytorch.org/tutorials/intermediate/
# ddp_tutorial.html, gloo on CPU), with a raise on rank 1, as a learner types it in a cell.
TUTORIAL_CELL = """
import os
import torch
import torch.distributed as dist
import torch.nn as nn
import torch.optim as optim
from torch.nn.parallel import DistributedDataParallel as DDP

def setup(rank, world_size):
    os.environ['MASTER_ADDR'] = 'localhost'
    os.environ['MASTER_PORT'] = '12355'
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

def demo_basic_broken(rank, world_size):
    print(f"Running basic DDP example on rank {rank}.")
    setup(rank, world_size)
    model = ToyModel()
    ddp_model = DDP(model)
    if rank == 1:
        raise RuntimeError("rank 1 lost its data loader")
    loss_fn = nn.MSELoss()
    optimizer = optim.SGD(ddp_model.parameters(), lr=0.001)
    optimizer.zero_grad()
    outputs = ddp_model(torch.randn(20, 10))
    loss_fn(outputs, torch.randn(20, 5)).backward()
    optimizer.step()
    cleanup()
"""


@pytest.mark.slow  # a kernel's start
def test_a_real_kernels_tutorial_function_shows_its_raising_line(tmp_path):
    from kernel_helpers import execute, start_kernel
    manager, client = start_kernel(tmp_path)
    try:
        assert execute(client, TUTORIAL_CELL).ok
        run = execute(client, """
            import ddp_lab
            try:
                ddp_lab.spawn(demo_basic_broken, args=(2,), nprocs=2, echo=False)
            except ddp_lab.WorkerError as err:
                caught = err
            print(caught.traceback)
        """)
        assert run.ok, run.reply
        assert 'raise RuntimeError("rank 1 lost its data loader")' in run.printed, run.printed
        assert "in demo_basic_broken" in run.printed and "<dynamic-code>" not in run.printed
    finally:
        client.stop_channels()
        manager.shutdown_kernel(now=True)
