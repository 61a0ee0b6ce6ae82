"""Notebook 06's training code: data loaders, the resumable DDP loop, the train_cnn script."""

from __future__ import annotations

import gzip
import os
import signal
import struct
import subprocess
import sys

import numpy as np
import pytest
import torch

import ddp_lab
from ddp_lab.course.data import MNIST_FILES, digits_arrays, load_dataset, load_mnist_idx, read_idx
from ddp_lab.scripts import script_path
from ddp_lab.scripts.train_cnn import parse_args
from ddp_lab.course.training import TrainConfig, train

pytestmark = pytest.mark.timeout(240)


def write_idx(path, array: np.ndarray, compress: bool = False) -> None:
    """An IDX file as MNIST publishes them: uint8 data, big-endian header."""
    header = bytes([0, 0, 0x08, array.ndim]) + struct.pack(f">{array.ndim}I", *array.shape)
    data = header + array.astype(np.uint8).tobytes()
    (gzip.open if compress else open)(path, "wb").write(data)


def fake_mnist(folder, n_train=64, n_test=32, compress=False):
    rng = np.random.default_rng(0)
    for split, n in (("train", n_train), ("test", n_test)):
        suffix = ".gz" if compress else ""
        write_idx(folder / (MNIST_FILES[f"{split}_images"] + suffix),
                  rng.integers(0, 256, (n, 28, 28)), compress)
        write_idx(folder / (MNIST_FILES[f"{split}_labels"] + suffix), rng.integers(0, 10, n),
                  compress)
    return folder


# --- data: no processes --------------------------------------------------------------------

def test_digits_split_is_reproducible_and_disjoint():
    train_a, test_a = load_dataset("digits")
    train_b, _ = load_dataset("digits")
    assert len(train_a) + len(test_a) == 1797
    assert train_a[0][0].shape == (1, 8, 8) and 0.0 <= train_a.tensors[0].min() <= 1.0
    torch.testing.assert_close(train_a.tensors[0], train_b.tensors[0])
    assert set(train_a.tensors[1].tolist()) == set(range(10))


def test_digits_read_from_the_file_equal_scikit_learns_load_digits():
    from sklearn.datasets import load_digits
    digits = load_digits()
    images, labels = digits_arrays()
    assert np.array_equal(images, digits.images) and np.array_equal(labels, digits.target)


def test_loading_the_digits_does_not_import_scikit_learn():
    code = ("import sys; from ddp_lab.course.data import load_dataset; load_dataset('digits'); "
            "print('sklearn' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.stdout.strip() == "False", out.stderr


@pytest.mark.parametrize("compress", [False, True])
def test_mnist_idx_loader_reads_generated_files(tmp_path, compress):
    train_set, test_set = load_mnist_idx(fake_mnist(tmp_path, compress=compress))
    assert len(train_set) == 64 and len(test_set) == 32
    images, labels = train_set.tensors
    assert images.shape == (64, 1, 28, 28) and images.dtype == torch.float32
    assert images.max() <= 1.0 and labels.dtype == torch.int64
    raw = read_idx(tmp_path / (MNIST_FILES["train_images"] + (".gz" if compress else "")))
    torch.testing.assert_close(images[:, 0], torch.tensor(raw).float() / 255)


def test_bad_data_paths_say_what_to_pass(tmp_path):
    with pytest.raises(FileNotFoundError, match="--data digits"):
        load_dataset(str(tmp_path / "nowhere"))
    with pytest.raises(FileNotFoundError, match="t10k-images-idx3-ubyte"):
        load_dataset(str(tmp_path))
    (tmp_path / "bad").write_bytes(b"PK\x03\x04 not idx")
    with pytest.raises(ValueError, match="not an IDX file"):
        read_idx(tmp_path / "bad")
    write_idx(tmp_path / "short", np.zeros((4, 3), np.uint8))
    (tmp_path / "short").write_bytes((tmp_path / "short").read_bytes()[:-2])
    with pytest.raises(ValueError, match="truncated"):
        read_idx(tmp_path / "short")


def test_script_arguments_map_to_the_config():
    config = parse_args(["--epochs", "2", "--batch-size", "8", "--lr", "0.1", "--seed", "3",
                         "--checkpoint", "ck.pt", "--no-progress"])
    assert config == TrainConfig(epochs=2, batch_size=8, lr=0.1, seed=3, checkpoint="ck.pt",
                                 progress=False)
    with pytest.raises(SystemExit):
        parse_args(["--epochs", "0"])


# --- training on real ranks ----------------------------------------------------------------

def test_training_learns_and_ranks_agree(capsys):
    res = ddp_lab.run(train, world_size=2, args=(TrainConfig(epochs=3),), timeout=120)
    out = capsys.readouterr().out
    assert "[rank 0] Epoch [0/3], Batch [0/23], Loss:" in out
    assert "[rank 0] Epoch [2/3] completed. Loss:" in out and "Test accuracy:" in out
    assert "[rank 1] Epoch" not in out  # rank 0 speaks for the job
    first, second = res.values
    torch.testing.assert_close(first["final_weights"], second["final_weights"], rtol=0, atol=0)
    assert first["accuracy"] == second["accuracy"] > 80.0
    assert first["epoch_losses"][-1] < first["epoch_losses"][0]
    assert first["batch_losses"] != second["batch_losses"]  # different shards, same model


@pytest.mark.parametrize("world_size, tolerance", [(2, 0.0), (3, 1e-6)])
def test_resumed_run_equals_uninterrupted_run(tmp_path, world_size, tolerance):
    """Bit for bit on 2 ranks; on 3 the first step after the resume sums in another order
    (training.py's docstring says why), so equal to float rounding. On 256 MNIST-shaped
    samples (a few steps an epoch: momentum, shuffling and the epoch counter all carry over)
    rather than the digits, which take several times longer and resume the same way."""
    data = str(fake_mnist(tmp_path, n_train=256))
    whole = ddp_lab.run(train, world_size=world_size, args=(TrainConfig(epochs=2, data=data),),
                        echo=False, timeout=120)
    checkpoint = str(tmp_path / "ck.pt")
    first = ddp_lab.run(train, world_size=world_size, echo=False,
                        args=(TrainConfig(epochs=1, data=data, checkpoint=checkpoint),))
    resumed = ddp_lab.run(train, world_size=world_size, echo=False,
                          args=(TrainConfig(epochs=2, data=data, checkpoint=checkpoint),))
    assert first[0]["epochs_run"] == [0] and resumed[0]["epochs_run"] == [1]
    for rank in range(world_size):
        torch.testing.assert_close(resumed[rank]["final_weights"],
                                   whole[rank]["final_weights"], rtol=0, atol=tolerance)
    assert "Resumed from" in resumed.logs[0]


def test_training_on_mnist_idx_files(tmp_path):
    config = TrainConfig(epochs=1, batch_size=16, data=str(fake_mnist(tmp_path)))
    res = ddp_lab.run(train, world_size=2, args=(config,), echo=False, timeout=120)
    assert 0.0 <= res[0]["accuracy"] <= 100.0 and len(res[0]["batch_losses"]) == 2


def test_train_cnn_script_via_run_script():
    res = ddp_lab.run_script(script_path("train_cnn.py"), world_size=2, echo=False,
                             script_args=["--epochs", "1", "--no-progress"], timeout=120)
    assert "Initialized process group with rank 1." in res.logs[1]
    assert "Test accuracy:" in res.logs[0] and res[0]["epochs_run"] == [0]
    assert f"Throughput: {res[0]['samples_per_s']:.0f} samples/s" in res.logs[0]


def test_train_cnn_bad_data_fails_before_rendezvous(tmp_path):
    with pytest.raises(ddp_lab.WorkerError, match="not 'digits' and not a folder"):
        ddp_lab.run_script(script_path("train_cnn.py"), world_size=2, echo=False,
                           script_args=["--data", str(tmp_path / "missing")], timeout=60)


def test_train_cnn_under_real_torchrun(tmp_path):
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone",
               "--nproc-per-node=2", f"--log-dir={tmp_path / 'logs'}",  # else /tmp/torchelastic_*
               "-m", "ddp_lab.scripts.train_cnn", "--epochs", "1",
               "--checkpoint", str(tmp_path / "ck.pt")]
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, start_new_session=True, cwd=tmp_path)
    try:
        out, _ = proc.communicate(timeout=180)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == 0, out
    assert "Epoch [0/1], Batch [0/23], Loss:" in out and "Epoch [0/1] completed." in out
    assert "Test accuracy:" in out and (tmp_path / "ck.pt").is_file()



# The last line of a probe: the names of this process's threads still alive.
THREADS_LEFT = ("d = f'/proc/{os.getpid()}/task'\n"
                "print(sorted(open(f'{d}/{t}/comm').read().strip() for t in os.listdir(d)))")
GLOO_THREADS = {"pt_gloo_runloop", "gloo_tcp_loop"}


def gloo_threads_left(code: str, tmp_path) -> set[str]:
    """Run ``code`` in a fresh interpreter as rank 0 of 1; gloo's threads alive at its end."""
    env = {**os.environ, "RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1",
           "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "0"}  # 0: the store picks a free port
    done = subprocess.run([sys.executable, "-c", f"import os\n{code}\n{THREADS_LEFT}"],
                          capture_output=True, text=True, env=env, cwd=tmp_path, timeout=120)
    assert done.returncode == 0, done.stderr
    return GLOO_THREADS & set(eval(done.stdout.strip().splitlines()[-1]))


@pytest.mark.parametrize("imported_first", [False, True])
def test_destroy_joins_gloo_threads_only_if_torch_distributed_nn_came_first(
        tmp_path, imported_first):
    """What train_cnn.py's comment says of torch 2.13: DDP's constructor imports
    torch.distributed.nn, whose defaults then hold the default group past
    destroy_process_group(), so gloo's threads live on into the interpreter's exit."""
    code = ("import torch, torch.distributed as dist\n"
            + ("import torch.distributed.nn\n" if imported_first else "")
            + "from torch.nn.parallel import DistributedDataParallel as DDP\n"
            "dist.init_process_group('gloo')\n"
            "def step():\n"
            "    DDP(torch.nn.Linear(4, 1))(torch.randn(2, 4)).sum().backward()\n"
            "step()\n"
            "dist.destroy_process_group()")
    assert gloo_threads_left(code, tmp_path) == (set() if imported_first else GLOO_THREADS)


@pytest.mark.parametrize("script", ["train_cnn", "crash_rank", "ddp_construct"])
def test_worker_scripts_leave_no_gloo_thread_to_the_interpreters_exit(tmp_path, script):
    # train_cnn on 64 MNIST-shaped samples: how the script ends does not depend on the data
    data = fake_mnist(tmp_path)
    args = {"train_cnn": f"['--epochs', '1', '--no-progress', '--data', {str(data)!r}]",
            "crash_rank": "['--crash-rank', '-1', '--steps', '2']", "ddp_construct": ""}[script]
    code = f"from ddp_lab.scripts import {script}\n{script}.main({args})"
    assert gloo_threads_left(code, tmp_path) == set()

# --- notebook 06's throughput demo --------------------------------------------

def test_step_throughput_reports_the_slowest_rank():
    from ddp_lab.course.ch06_training.throughput import StepConfig, scaling_table, step_throughput

    config = StepConfig(steps=2, warmup=1)
    results = {n: ddp_lab.run(step_throughput, world_size=n, args=(config,), echo=False)
               for n in (1, 2)}
    assert results[2][0] == results[2][1]  # one figure for the job, agreed by all ranks
    two = results[2][0]
    assert two["samples_per_s"] == pytest.approx(2 * 32 / two["step_s"])
    rows = scaling_table({n: r[0] for n, r in results.items()})
    assert rows[0]["speedup"] == 1.0 and rows[1]["efficiency"] == rows[1]["speedup"] / 2


def test_step_flops_of_the_two_workloads_do_not_depend_on_load():
    """Notebook 06 asserts the 28x28 step's compute against the 8x8 one's in FLOPs, which
    load cannot move (two timed launches compared under load failed)."""
    from ddp_lab.course.ch06_training.throughput import StepConfig, step_flops

    small = step_flops(StepConfig(image_size=8))
    large = step_flops(StepConfig(per_rank_batch=64, image_size=28))
    assert step_flops(StepConfig(image_size=8)) == small  # counted, not timed: the same every run
    assert small["sample_flops"] * 32 == small["step_flops"]
    assert 20 < large["step_flops"] / small["step_flops"] < 24.5
    assert 10 < large["sample_flops"] / small["sample_flops"] < 12.25


def test_each_rank_brings_its_own_loader_workers():
    from ddp_lab.course.ch06_training import oversubscription
    footprints = ddp_lab.run(oversubscription.loader_footprint, 2, kwargs={"num_workers": 3},
                             echo=False).values
    assert [f["loader_workers"] for f in footprints] == [3, 3]
    assert oversubscription.busy_per_machine(footprints) == 2 * (3 + footprints[0]["intra_op_threads"])
    assert oversubscription.busy_per_machine(footprints) > oversubscription.cores()
    assert all(f["worker_threads"] == [1] for f in footprints)  # torch's worker loop sets 1
