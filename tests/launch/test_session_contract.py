"""The session contract (``api.RunSession``, ``api.LiveRunSession``) and its one driver
(``api.drive``): each session keeps it by its shape (the verbs, with the Protocol's
parameters) and by what it does (start, wait, record, close; a live session's calls), and
the live session changes the one-shot session only where ``Session`` declares it may.
Nothing may be left behind (conftest's leak check runs after each test)."""

from __future__ import annotations

import inspect
import os
import signal
from dataclasses import replace

import pytest

import ddp_lab
import workers
from ddp_lab.launch import checks
from ddp_lab.launch.api import LiveRunSession, RunSession, drive, pickle_payload, prepare
from ddp_lab.launch.live.outcome import verdict
from ddp_lab.launch.live.session import LiveSession
from ddp_lab.launch.session import Session
from ddp_lab.launch.torchrun.session import TorchrunSession
from ddp_lab.launch.verdict.outcome import conclude
from ddp_lab.launch.verdict.record import RunRecord

pytestmark = pytest.mark.timeout(180)

VERBS = ("start", "wait", "record", "close")
SCRIPT = "print('hello')\n"


def config(world_size: int = 2, **kwargs):
    return checks.checked_config(world_size, timeout=30, echo=False, **kwargs)


def sessions(tmp_path) -> dict:
    script = tmp_path / "hello.py"
    script.write_text(SCRIPT)
    return {"one-shot": Session(config(), None), "live": LiveSession(config()),
            "torchrun": TorchrunSession(config(script=(str(script), [])))}


def parameters(function) -> list[str]:
    return list(inspect.signature(function).parameters)


@pytest.mark.parametrize("kind", ["one-shot", "live", "torchrun"])
def test_every_session_has_the_contract_s_verbs_with_its_parameters(kind, tmp_path):
    session = sessions(tmp_path)[kind]
    assert isinstance(session, RunSession)
    for verb in VERBS:
        assert parameters(getattr(session, verb)) == parameters(getattr(RunSession, verb))[1:]
    assert isinstance(session, LiveRunSession) == (kind == "live")
    if kind == "live":
        assert parameters(session.call) == parameters(LiveRunSession.call)[1:]


def test_the_live_session_overrides_no_private_method_of_the_one_shot_session():
    """What a live session changes is declared by ``Session``: its ``rank_pipes`` and its
    public verbs, not a private method overridden behind its back."""
    grafted = {name for name in vars(LiveSession) if name.startswith("_")
               and not name.startswith("__") and hasattr(Session, name)}
    assert grafted == set()
    overridden = {name for name in vars(LiveSession) if not name.startswith("_")
                  and hasattr(Session, name)}
    assert overridden == {"start", "wait", "record"}


@pytest.mark.parametrize("kind", ["one-shot", "live", "torchrun"])
def test_a_session_closed_before_it_started_made_nothing(kind, tmp_path):
    with sessions(tmp_path)[kind] as session:
        pass
    assert getattr(session, "run_dir", None) is None


def test_drive_runs_a_one_shot_session_to_its_values():
    cfg = prepare(config())
    payload = pickle_payload(workers.rank_and_env, (), {})
    res = drive(Session(cfg, payload))
    assert [v["rank"] for v in res.values] == [0, 1]


def test_drive_raises_the_verdict_and_still_closes():
    session = Session(prepare(config(3)), pickle_payload(workers.raise_on, (1,), {}))
    with pytest.raises(ddp_lab.WorkerError) as info:
        drive(session)
    assert info.value.rank == 1
    assert not session.fds and session.run_dir is not None and not os.path.exists(session.run_dir)


def test_a_live_session_keeps_the_contract_call_by_call():
    cfg = prepare(config())
    session = LiveSession(cfg)
    with session:
        session.start()
        ready = session.wait()
        assert ready.seq == 0 and sorted(ready.replies) == [0, 1]
        session.call("pull", {0: "rank", 1: "rank"}, timeout=30)
        call = session.wait()
        assert verdict(session, call).values == [0, 1]
        record = session.record()
        assert isinstance(record, RunRecord) and record.returned == {0, 1}
        session.call("exec", {1: ("raise KeyError('nope')", "<contract cell>")}, timeout=30)
        session.wait()
        with pytest.raises(ddp_lab.WorkerError) as info:
            conclude(session.record())
        assert info.value.rank == 1 and "KeyError" in info.value.traceback
    assert not session.fds and not os.path.exists(session.run_dir)


def test_a_torchrun_session_started_and_closed_at_once_leaves_nothing(tmp_path):
    """``close`` right after ``start``: the agent (maybe still importing torch) is killed
    with whatever it started, its pipes closed, the run folder removed."""
    script = tmp_path / "hello.py"
    script.write_text(SCRIPT)
    cfg = config(script=(str(script), []))
    with TorchrunSession(cfg) as session:
        session.start()
        agent = session.agent
    assert agent.returncode is not None and not os.path.exists(session.run_dir)


def test_drive_runs_a_torchrun_session(tmp_path):
    script = tmp_path / "hello.py"
    script.write_text(SCRIPT)
    cfg = replace(config(script=(str(script), [])), backend="gloo")  # as api resolves "auto"
    res = drive(TorchrunSession(cfg))
    assert res.logs == ["hello", "hello"]


class InterruptedEcho:
    """The echo a session closes while it cleans up, hit by Ctrl-C right then."""

    def show(self, *args, **kwargs) -> None:
        pass

    def close(self) -> None:
        signal.raise_signal(signal.SIGINT)


@pytest.mark.parametrize("kind", ["one-shot", "live", "torchrun"])
def test_close_finishes_its_cleanup_before_it_raises_a_ctrl_c(kind, tmp_path):
    """Ctrl-C held back while ``close`` runs: the run folder and every descriptor are gone
    before the KeyboardInterrupt is raised (here, Ctrl-C as its echo is closed)."""
    sleeping = pickle_payload(workers.write_pid_and_sleep, (str(tmp_path),), {})
    session = {"one-shot": lambda: Session(prepare(config()), sleeping),
               "live": lambda: LiveSession(prepare(config())),
               "torchrun": lambda: sessions(tmp_path)["torchrun"]}[kind]()
    with pytest.raises(KeyboardInterrupt):
        with session:
            session.start()
            session.echo = InterruptedEcho()
    assert not os.path.exists(session.run_dir)
    assert not getattr(session, "fds", None)
