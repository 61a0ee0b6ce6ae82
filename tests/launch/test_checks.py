"""Bad input fails fast with an error that says what to do, before any process starts."""

from __future__ import annotations

import os
import threading

import psutil
import pytest

import ddp_lab
import workers
from ddp_lab.launch import checks

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
    ({"env": {"A=B": "1"}}, ValueError, "'A=B' is not a variable name"),
    ({"env": {"": "1"}}, ValueError, "'' is not a variable name"),
    ({"env": {"A": "x\0y"}}, ValueError, "NUL"),
    ({"env": {"A\0": "1"}}, ValueError, "NUL"),
    ({"env": {"BIG": "x" * 2_000_000}}, ValueError, "BIG.*over 128 KiB.*MAX_ARG_STRLEN"),
    ({"env": {f"V{i}": "x" * 100_000 for i in range(6)}}, ValueError, "more than the 512 KiB"),
    ({"timeout": 1e300}, ValueError, "7 days"),
    ({"timeout": 1e10}, ValueError, "7 days"),
    ({"world_size": 10**6}, ValueError, "more than this machine can run:\n  - memory:"),
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


def test_bad_script_env_is_rejected_before_any_process_starts(tmp_path):
    script = tmp_path / "s.py"
    script.write_text("pass\n")
    before = _children()
    for launcher in ("ddp_lab", "torchrun"):
        with pytest.raises(ValueError, match="not a variable name"):
            ddp_lab.run_script(script, world_size=2, env={"A=B": "1"}, launcher=launcher)
        with pytest.raises(ValueError, match="more than this machine can run"):
            ddp_lab.run_script(script, world_size=10**6, launcher=launcher)
    assert _children() <= before


def test_too_few_file_descriptors_are_named():
    import resource
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (256, hard))
    try:
        with pytest.raises(ValueError, match=r"open files: the limit \(ulimit -n\) is 256"):
            checks.check_resources(300)
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_too_many_ranks_per_core_are_named():
    with pytest.raises(ValueError, match="cores: .* run at most"):
        checks.check_resources(checks.RANKS_PER_CORE * len(os.sched_getaffinity(0)) + 1)


def test_limits_can_be_skipped_by_those_who_know(monkeypatch):
    monkeypatch.setenv(checks.SKIP_LIMITS_VAR, "1")
    checks.check_resources(10**6)  # no error: the caller said so


def test_a_week_is_the_longest_timeout():
    assert checks.check_timeout(7 * 24 * 3600) == 604800.0


# -- checked_config: the one place a run's settings are built from the caller's arguments --

def test_checked_config_holds_the_checked_values():
    from ddp_lab.launch.config import LaunchConfig
    env = {"A": "1"}
    config = checks.checked_config(3, "gloo", 5, env, echo=0)
    assert config == LaunchConfig(world_size=3, backend="gloo", timeout=5.0, env={"A": "1"},
                                  echo=False)
    assert type(config.timeout) is float and config.env is not env  # the caller's dict stays theirs
    assert checks.checked_config(2) == LaunchConfig(world_size=2, backend="auto",
                                                    timeout=60.0, env={})
    assert checks.checked_config(2, init_group=False).init_group is False


def test_checked_config_checks_a_script_and_its_arguments(tmp_path):
    script = tmp_path / "s.py"
    script.write_text("pass\n")
    config = checks.checked_config(2, script=(str(script), ["--epochs", "1"]))
    assert (config.script, config.script_args) == (str(script.resolve()), ("--epochs", "1"))
    with pytest.raises(TypeError, match="script must be a path"):
        checks.checked_config(2, script=(None, ()))  # run_script(None) is no function run
    with pytest.raises(ValueError, match="not found"):  # the script first, as run_script did
        checks.checked_config(0, script=(tmp_path / "nope.py", ()))


def test_checked_config_checks_the_network_against_the_checked_world():
    from ddp_lab.launch.network.setting import Network
    assert checks.checked_config(2, network="200mbit").network == Network(bandwidth="200mbit")
    assert checks.checked_config(2).network is None
    with pytest.raises(ValueError, match="NCCL on GPUs does not go through it"):
        checks.checked_config(2, backend="nccl", network="1gbit")
    with pytest.raises(ValueError, match="at least 1"):  # the world size before the network
        checks.checked_config(0, network="fast")
    with pytest.raises(ValueError, match="rank_bandwidth names ranks \\[3\\]"):
        checks.checked_config(2, network=Network(rank_bandwidth={3: "1gbit"}))


@pytest.mark.parametrize("bad, error, words", [
    ({"world_size": 0}, ValueError, "at least 1"),
    ({"timeout": float("nan")}, ValueError, "finite"),
    ({"env": {"A": 1}}, TypeError, "str to str"),
])
def test_every_entry_point_refuses_bad_settings_in_the_same_words(tmp_path, bad, error, words):
    """run, run_script, spawn and Ranks all build their settings with checked_config."""
    script = tmp_path / "s.py"
    script.write_text("pass\n")
    world_size, rest = bad.get("world_size", 2), {k: v for k, v in bad.items()
                                                  if k != "world_size"}
    before = _children()
    with pytest.raises(error, match=words) as built:
        checks.checked_config(world_size, **rest)
    for call in (lambda: ddp_lab.run(workers.rank_and_env, world_size, **rest),
                 lambda: ddp_lab.run_script(script, world_size, **rest),
                 lambda: ddp_lab.spawn(workers.raise_on, nprocs=world_size, **rest),
                 lambda: ddp_lab.Ranks(world_size, **rest)):
        with pytest.raises(error) as caught:
            call()
        assert str(caught.value) == str(built.value)
    assert _children() <= before
