"""The seal itself (ddp_lab/exercises/sealed.py), in this process: each door closed unless
opened, a refusal that stays a refusal when the learner's code catches it, the references
out of reach by value, the checkers' own instruments, and the dealt inputs wiped."""

from __future__ import annotations

import gc
import os
import socket
import subprocess
import sys
import threading
import types

import pytest

import ddp_lab.exercises as ex
from ddp_lab.course.collective_trace import BuiltinSwitchedOff
from ddp_lab.exercises.sealed import DOORS, Sealed, deal, instrument, sealing


def exercise(*open_doors):
    return types.SimpleNamespace(name="test.seal", open_doors=open_doors, answered_by=())


def write_a_file(path):
    with open(path, "w") as handle:
        handle.write("x")


def start_a_thread():
    threading.Thread(target=lambda: None).start()


def a_socket():
    socket.socket().close()


def read_the_callers_frame():
    """Up the stack until the checker's frames: the seal's caller is a few frames up."""
    return [sys._getframe(depth).f_locals for depth in range(1, 12)]


def list_every_object():
    return len(gc.get_objects())


def run_a_process():
    subprocess.run(["true"], check=True)


def use_the_store():
    from torch.distributed import HashStore
    HashStore()


DOOR_TRIES = {"files": lambda tmp: write_a_file(tmp / "f"), "threads": lambda _: start_a_thread(),
              "sockets": lambda _: a_socket(), "frames": lambda _: read_the_callers_frame(),
              "gc": lambda _: list_every_object(), "subprocess": lambda _: run_a_process(),
              "store": lambda _: use_the_store()}


def test_every_door_has_a_try():
    assert set(DOOR_TRIES) == set(DOORS)


@pytest.mark.parametrize("door", DOORS)
def test_a_closed_door_refuses_and_an_open_one_lets_through(door, tmp_path):
    def attempt():
        return DOOR_TRIES[door](tmp_path)
    with pytest.raises(BuiltinSwitchedOff, match="closed"):
        Sealed(attempt, exercise())()
    Sealed(attempt, exercise(door))()
    assert not list(tmp_path.iterdir()) or door == "files"


def test_a_caught_refusal_still_fails_the_call(tmp_path):
    def sly():
        try:
            write_a_file(tmp_path / "f")
        except BuiltinSwitchedOff:
            pass
        return "fine"
    with pytest.raises(BuiltinSwitchedOff, match="closed"):
        Sealed(sly, exercise())()
    assert not (tmp_path / "f").exists()


def test_everything_is_open_again_after_the_call(tmp_path):
    with pytest.raises(BuiltinSwitchedOff):
        Sealed(start_a_thread, exercise())()
    start_a_thread()
    write_a_file(tmp_path / "after")
    assert sys.getprofile() is None


def test_the_reference_is_out_of_reach_by_value_not_by_name():
    name = "03.all_to_all"
    reference = ex.solution(name)
    copied = types.FunctionType(reference.__code__, reference.__globals__, "mine")
    for fn in (reference, copied):
        with pytest.raises(BuiltinSwitchedOff, match="not code of your own"):
            Sealed(fn, ex.registry.find(name))([])

    def calls_it(chunks):
        return copied(chunks)
    with pytest.raises(BuiltinSwitchedOff, match="out of reach"):
        Sealed(calls_it, ex.registry.find(name))([])


def test_a_reference_pasted_into_a_cell_is_the_learners_own_code():
    """Solved mode pastes the reference's source into the cell: new code, from a cell."""
    import inspect
    import textwrap
    source = textwrap.dedent(inspect.getsource(ex.solution("00.max_over_ranks")))
    namespace = {"__name__": "__main__"}
    exec(compile("import torch\nimport torch.distributed as dist\n" + source,
                 "<00_launching solved>", "exec"), namespace)
    fn = namespace[ex.solution("00.max_over_ranks").__name__]
    seal = Sealed(fn, ex.registry.find("00.max_over_ranks"))
    assert seal.function() is not None  # not refused as the reference itself


def test_only_the_packages_instruments_lift_the_seal(tmp_path):
    def mine():
        write_a_file(tmp_path / "f")
    with pytest.raises(BuiltinSwitchedOff, match="instruments"):
        instrument(mine)

    def decorates_inside():
        instrument(write_a_file)
    with pytest.raises(BuiltinSwitchedOff):
        Sealed(decorates_inside, exercise())()


def test_a_learners_class_runs_sealed_method_by_method(tmp_path):
    class Model:
        def __init__(self, path):
            self.path = path

        def step(self):
            write_a_file(self.path)

    built = Sealed(Model, exercise())(tmp_path / "f")
    with pytest.raises(BuiltinSwitchedOff, match="closed"):
        built.step()
    assert isinstance(built, Model)


def test_dealt_inputs_are_wiped_once_taken():
    dealt = deal([10, 20, 30])
    items = dealt.items
    assert dealt.take(rank=1) == 20
    assert all(not any(item) for item in items)
    with pytest.raises(RuntimeError, match="taken already"):
        dealt.take(rank=0)


def test_the_seal_is_reentrant_and_leaves_no_trace():
    outer = Sealed(lambda: None, exercise())
    with sealing(outer):
        with sealing(outer):
            pass
    assert sys.getprofile() is None
    assert os.getpid() > 0 and threading.Thread is not None


def test_a_patch_of_the_library_is_put_back_and_refused():
    """A rebinding outlives the call: it would run the learner's code after the seal closed
    (when the rank pickles its value, or the checker's code calls the name)."""
    import pickle

    import torch
    import torch.distributed as dist
    dumps, barrier = pickle.dumps, dist.barrier

    def patches():
        pickle.dumps = lambda *args, **kwargs: b""
        dist.barrier = lambda *args, **kwargs: None
        torch.Tensor.clone = lambda self: self  # shadows TensorBase.clone
        from torch.distributed import fsdp  # noqa: F401 - a new name bound: let be
    with pytest.raises(BuiltinSwitchedOff, match="rebound") as refused:
        Sealed(patches, exercise(*DOORS))()
    for name in ("pickle.dumps", "torch.distributed.barrier", "Tensor.clone"):
        assert name in str(refused.value)
    assert (pickle.dumps, dist.barrier) == (dumps, barrier)
    assert "clone" not in vars(torch.Tensor)
    assert Sealed(lambda: sum([1, 2]), exercise())() == 3  # nothing rebound: no refusal


def test_a_module_whose_names_changed_between_seals_is_read_afresh():
    """The seal caches each guarded module's names while its size stays: a name removed and
    another added (the same size) must not break the next seal."""
    import ddp_lab.exercises.fingerprints as module
    Sealed(lambda: None, exercise())()
    try:
        module.swapped_in = module.fingerprint
        removed = module.own_cell_code
        del module.own_cell_code
        Sealed(lambda: None, exercise())()
    finally:
        module.own_cell_code = removed
        del module.swapped_in
