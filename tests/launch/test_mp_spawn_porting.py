"""The porting guide (docs/porting.md), applied to the published code it names: each test runs that
code with exactly the edits the guide lists for a CPU-only machine, and no other change.

Sources: https://pytorch.org/tutorials/intermediate/ddp_tutorial.html (setup, ToyModel,
demo_basic, demo_checkpoint, as of its torch.accelerator version) and pytorch/examples'
distributed/ddp/example.py (a torchrun script with a GPU-count guard).
"""

from __future__ import annotations

import os
import tempfile
import textwrap
import warnings

import pytest
import torch
import torch.distributed as dist
import torch.nn as nn
import torch.optim as optim
from torch.nn.parallel import DistributedDataParallel as DDP

import ddp_lab
from ddp_lab.launch.verdict.skips import SkippedRunWarning

pytestmark = [pytest.mark.timeout(180),
              pytest.mark.skipif(torch.accelerator.is_available(),
                                 reason="the guide's edits are for machines without GPUs")]


# ---- the DDP tutorial, with the guide's edits marked "edit:" -------------------------------

def setup(rank, world_size):
    os.environ['MASTER_ADDR'] = 'localhost'
    os.environ['MASTER_PORT'] = '12355'

    # We want to be able to train our model on an `accelerator <https://pytorch.org/docs/stable/torch.html#accelerators>`__
    # such as CUDA, MPS, MTIA, or XPU.
    acc = torch.accelerator.current_accelerator()
    backend = "gloo" if acc is None else torch.distributed.get_default_backend_for_device(acc)  # edit
    # initialize the process group
    dist.init_process_group(backend, rank=rank, world_size=world_size)


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

    # create model and move it to GPU with id rank
    model = ToyModel()                # edit: no .to(rank)
    ddp_model = DDP(model)            # edit: no device_ids=[rank]

    loss_fn = nn.MSELoss()
    optimizer = optim.SGD(ddp_model.parameters(), lr=0.001)

    optimizer.zero_grad()
    outputs = ddp_model(torch.randn(20, 10))
    labels = torch.randn(20, 5)       # edit: no .to(rank)
    loss_fn(outputs, labels).backward()
    optimizer.step()

    cleanup()
    print(f"Finished running basic DDP example on rank {rank}.")


def demo_checkpoint(rank, world_size):
    print(f"Running DDP checkpoint example on rank {rank}.")
    setup(rank, world_size)

    model = ToyModel()                # edit: no .to(rank)
    ddp_model = DDP(model)            # edit: no device_ids=[rank]

    CHECKPOINT_PATH = tempfile.gettempdir() + "/model.checkpoint"
    if rank == 0:
        # All processes should see same parameters as they all start from same
        # random parameters and gradients are synchronized in backward passes.
        # Therefore, saving it in one process is sufficient.
        torch.save(ddp_model.state_dict(), CHECKPOINT_PATH)

    # Use a barrier() to make sure that process 1 loads the model after process
    # 0 saves it.
    dist.barrier()
    # configure map_location properly
    map_location = "cpu"              # edit: the tutorial's {f'{acc}:0': f'{acc}:{rank}'} is for GPUs
    ddp_model.load_state_dict(
        torch.load(CHECKPOINT_PATH, map_location=map_location, weights_only=True))

    loss_fn = nn.MSELoss()
    optimizer = optim.SGD(ddp_model.parameters(), lr=0.001)

    optimizer.zero_grad()
    outputs = ddp_model(torch.randn(20, 10))
    labels = torch.randn(20, 5)       # edit: no .to(rank)

    loss_fn(outputs, labels).backward()
    optimizer.step()

    # Not necessary to use a dist.barrier() to guard the file deletion below
    # as the AllReduce ops in the backward pass of DDP already served as
    # a synchronization.

    if rank == 0:
        os.remove(CHECKPOINT_PATH)

    cleanup()
    print(f"Finished running DDP checkpoint example on rank {rank}.")


# The tutorial's `if __name__ == "__main__":` block asserts n_gpus >= 2 and spawns
# torch.accelerator.device_count() ranks; the guide's edit: world_size = 2, and
# mp.spawn(demo_fn, args=(world_size,), nprocs=world_size, join=True) -> ddp_lab.spawn.
WORLD_SIZE = 2
# ---- end of the tutorial's code


def _run_demo(demo_fn):
    with warnings.catch_warnings():
        warnings.simplefilter("error", SkippedRunWarning)  # it ran: no skip warning
        return ddp_lab.spawn(demo_fn, args=(WORLD_SIZE,), nprocs=WORLD_SIZE, join=True)


@pytest.mark.parametrize("demo_fn, name", [(demo_basic, "basic DDP example"),
                                           (demo_checkpoint, "DDP checkpoint example")])
def test_the_tutorials_demos_run_with_the_guides_edits(demo_fn, name):
    res = _run_demo(demo_fn)
    assert res.values == [None] * WORLD_SIZE  # as the tutorial's functions return
    for rank, log in enumerate(res.logs):
        assert f"Finished running {name} on rank {rank}." in log, log
    assert not os.path.exists(tempfile.gettempdir() + "/model.checkpoint")


def unedited_setup(rank, world_size):
    """The tutorial's setup() as published: what the guide's first edit is for."""
    os.environ['MASTER_ADDR'] = 'localhost'
    os.environ['MASTER_PORT'] = '12355'
    acc = torch.accelerator.current_accelerator()
    backend = torch.distributed.get_default_backend_for_device(acc)
    dist.init_process_group(backend, rank=rank, world_size=world_size)


def unedited_model(rank, world_size):
    """The tutorial's first device line as published, after the edited setup()."""
    setup(rank, world_size)
    ToyModel().to(rank)


@pytest.mark.parametrize("fn, words", [
    (unedited_setup, "device() received an invalid combination of arguments - got (NoneType)"),
    (unedited_model, "Cannot access accelerator device when none is available"),
])
def test_without_the_edits_the_tutorial_fails_as_the_guide_says(fn, words):
    with pytest.raises(ddp_lab.WorkerError) as failed:
        ddp_lab.spawn(fn, args=(WORLD_SIZE,), nprocs=WORLD_SIZE)
    assert words in str(failed.value) + failed.value.traceback


# ---- pytorch/examples distributed/ddp/example.py, trimmed to its launch logic ----------------
EXAMPLE = '''
import os, sys
import torch
import torch.distributed as dist

def verify_min_gpu_count(min_gpus: int = 2) -> bool:
    has_gpu = torch.accelerator.is_available()
    gpu_count = torch.accelerator.device_count()
    return has_gpu and gpu_count >= min_gpus

def main():
    rank = int(os.environ["RANK"])
    acc = torch.accelerator.current_accelerator()
    backend = "gloo" if acc is None else torch.distributed.get_default_backend_for_device(acc)  # edit
    if torch.accelerator.is_available():  # edit: only with an accelerator
        torch.accelerator.set_device_index(rank)
    dist.init_process_group(backend=backend)
    t = torch.ones(1)
    dist.all_reduce(t)
    print(f"training completed in rank {rank}!")
    dist.destroy_process_group()

if __name__ == "__main__":
    _min_gpu_count = 2
    if GUARD and not verify_min_gpu_count(min_gpus=_min_gpu_count):
        print(f"Unable to locate sufficient {_min_gpu_count} gpus to run this example. Exiting.")
        sys.exit()
    main()
'''


def test_the_examples_gpu_guard_skips_with_exit_0_and_warns(tmp_path):
    script = tmp_path / "example.py"
    script.write_text(textwrap.dedent(EXAMPLE).replace("GUARD", "True"))
    with pytest.warns(SkippedRunWarning, match="Unable to locate sufficient 2 gpus"):
        res = ddp_lab.run_script(script, world_size=2)
    assert res.values == [None, None]  # a "success" in which nothing ran


def test_the_example_runs_once_its_guard_is_removed(tmp_path):
    script = tmp_path / "example.py"
    script.write_text(textwrap.dedent(EXAMPLE).replace("GUARD", "False"))  # edit: no guard
    with warnings.catch_warnings():
        warnings.simplefilter("error", SkippedRunWarning)
        res = ddp_lab.run_script(script, world_size=2)
    for rank, log in enumerate(res.logs):
        assert f"training completed in rank {rank}!" in log
