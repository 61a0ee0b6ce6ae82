"""Ranks' values read as plain data only (ddp_lab/launch/verdict/plain_values.py), as a checker
reads them: the learner's code in a rank must not run in the checker's process."""

from __future__ import annotations

import io
import os
import pickle

import cloudpickle
import numpy as np
import pytest
import torch

from ddp_lab.launch.verdict.plain_values import NotPlainData, PlainUnpickler, loads, plain_values


def liar(x: float) -> float:
    """A float that equals everything (compared in the checker, it would pass any check),
    of a class defined in a function: cloudpickle sends it by value, as a notebook's."""
    class Liar(float):
        def __eq__(self, other):
            return True

        __hash__ = float.__hash__
    return Liar(x)


def plain(value):
    return PlainUnpickler(io.BytesIO(cloudpickle.dumps(value))).load()


def test_plain_data_comes_back_equal():
    value = {"a": [1, 2.5, 3j, "s", b"b", None, True], "t": torch.arange(6.).reshape(2, 3)[:, 1],
             "p": torch.nn.Parameter(torch.ones(2)), "dtype": torch.float16,
             "size": torch.Size([2, 3]), "n": np.arange(4, dtype=np.int32), "set": {1, 2}}
    back = plain(value)
    assert torch.equal(back["t"], value["t"]) and torch.equal(back["p"], value["p"])
    assert isinstance(back["p"], torch.nn.Parameter)
    assert np.array_equal(back["n"], value["n"]) and back["n"].dtype == np.int32
    assert {k: v for k, v in back.items() if k not in ("t", "p", "n")} == \
        {k: v for k, v in value.items() if k not in ("t", "p", "n")}


class Exploit:
    def __reduce__(self):
        return (os.system, ("true",))


@pytest.mark.parametrize("value, named", [
    (liar(1.0), "a class or function defined in the rank's own code"),
    (Exploit(), "posix.system"),
    (lambda: 1, "a class or function defined in the rank's own code"),
])
def test_anything_else_is_refused_by_name(value, named):
    with pytest.raises(NotPlainData) as refused:
        plain(value)
    assert refused.value.what == named


def test_a_tensors_storage_is_read_by_torchs_loader_for_untrusted_files():
    """The storage's bytes are a torch.save file: read with weights_only=True, a pickle
    hidden in them cannot name os.system either."""
    class Storage:
        def __reduce__(self):
            return (torch.storage._load_from_bytes, (pickle.dumps(Exploit()),))
    crafted = pickle.dumps(Storage())
    with pytest.raises(pickle.UnpicklingError, match="Weights only load failed"):
        PlainUnpickler(io.BytesIO(crafted)).load()


def test_only_inside_the_block():
    data = cloudpickle.dumps(liar(2.0))
    assert loads(data) == 2.0 and type(loads(data)).__name__ == "Liar"
    with plain_values(), pytest.raises(NotPlainData):
        loads(data)
    assert type(loads(data)).__name__ == "Liar"
