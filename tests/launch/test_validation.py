"""Bad input fails fast with an error that says what to do, before any process starts."""

from __future__ import annotations

import threading

import psutil
import pytest

import ddp_lab
import workers

pytestmark = pytest.mark.timeout(60)


def _children() -> set[int]:
    return {p.pid for p in psutil.Process().children(recursive=True)}


@pytest.mark.parametrize("kwargs, error, words", [
    ({"world_size": 0}, ValueError, "at least 1"),
    ({"world_size": -2}, ValueError, "at least 1"),
    ({"world_size": 2.0}, TypeError, "positive int"),
    ({"world_size": "4"}, TypeError, "positive int"),
    ({"world_size": True}, TypeError, "positive int"),
    ({"backend": "mpi"}, ValueError, "'gloo'"),
    ({"backend": "NCCL "}, ValueError, "unknown backend"),
    ({"timeout": 0}, ValueError, "positive"),
    ({"timeout": -1.0}, ValueError, "positive"),
    ({"timeout": float("inf")}, ValueError, "finite"),
    ({"timeout": "10"}, TypeError, "seconds"),
    ({"env": {"A": 1}}, TypeError, "str to str"),
    ({"env": ["A=1"]}, TypeError, "dict"),
    ({"args": 3}, TypeError, "args=(x,)"),
    ({"kwargs": [1]}, TypeError, "kwargs must be a dict"),
    ({"args": (threading.Lock(),)}, TypeError, "cannot be sent to the ranks"),
    ({"kwargs": {"gen": (i for i in range(3))}}, TypeError, "inside fn"),
])
def test_bad_run_input_is_rejected_before_any_process_starts(kwargs, error, words):
    before = _children()
    call = {"world_size": 2, **kwargs}
    with pytest.raises(error, match=words.replace("(", r"\(").replace(")", r"\)")):
        ddp_lab.run(workers.rank_and_env, **call)
    assert _children() <= before


def test_fn_must_be_callable():
    with pytest.raises(TypeError, match="run_script"):
        ddp_lab.run("train.py", world_size=2)


def test_nccl_without_gpus_says_what_to_do():
    import torch
    if torch.cuda.is_available() and torch.cuda.device_count() >= 64:
        pytest.skip("this machine really has 64 GPUs")
    before = _children()
    with pytest.raises(ValueError, match="one GPU per rank.*backend='gloo'"):
        ddp_lab.run(workers.rank_and_env, world_size=64, backend="nccl")
    assert _children() <= before


def test_missing_script_is_rejected(tmp_path):
    with pytest.raises(ValueError, match="not found"):
        ddp_lab.run_script(tmp_path / "nope.py", world_size=2)


def test_script_args_must_be_strings(tmp_path):
    script = tmp_path / "s.py"
    script.write_text("pass\n")
    with pytest.raises(TypeError, match="list of strings"):
        ddp_lab.run_script(script, world_size=2, script_args=["--epochs", 1])
    with pytest.raises(TypeError, match="list of strings"):
        ddp_lab.run_script(script, world_size=2, script_args="--epochs 1")
