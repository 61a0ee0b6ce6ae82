"""The course's own code calls the single-tensor collectives by their torch 2.13 names.

torch 2.13 deprecates ``dist.all_gather_into_tensor`` and ``dist.reduce_scatter_tensor`` with
a FutureWarning in favour of ``all_gather_single`` / ``reduce_scatter_single``
(torch/distributed/distributed_c10d.py, the ``@deprecated`` decorators on both). Code the
notebooks print (scratch FSDP in 10, ``hierarchical_all_reduce`` in 11) and the reference and
recipe of exercise 10.shard_gradient must teach the current names; the checker still accepts
both spellings (tests/exercises/mutants_ch10_ch11.py, RIGHT)."""

from __future__ import annotations

import inspect
import re
import warnings

import torch
import torch.distributed as dist
import torch.nn as nn

import ddp_lab.exercises as ex
from ddp_lab.course.ch10_sharding import shard_exercise
from ddp_lab.course.ch11_meshes import meshes
from ddp_lab.scratch import fsdp

DEPRECATED = re.compile(r"\bdist\.(all_gather_into_tensor|reduce_scatter_tensor)\(")


def test_torch_deprecates_the_old_names():
    for old, new in (("all_gather_into_tensor", "all_gather_single"),
                     ("reduce_scatter_tensor", "reduce_scatter_single")):
        assert hasattr(dist, new)
        assert f"Please use `torch.distributed.{new}` instead" in inspect.getsource(
            inspect.getmodule(getattr(dist, old))), old


def test_printed_code_and_the_reference_use_the_current_names():
    for source in (inspect.getsource(fsdp), inspect.getsource(meshes.hierarchical_all_reduce),
                   inspect.getsource(shard_exercise.shard_gradient)):
        assert not DEPRECATED.search(source), DEPRECATED.search(source).group(0)
    assert "reduce_scatter_single" in inspect.getsource(fsdp._GatherParam.backward)
    assert "all_gather_single" in inspect.getsource(fsdp.gather_full)


def test_the_recipe_names_the_current_call_and_the_old_one_as_deprecated():
    recipe = ex.find("10.shard_gradient").recipe
    assert "dist.reduce_scatter_single(shard, flat)" in recipe
    assert "reduce_scatter_tensor" in recipe and "FutureWarning" in recipe


def test_the_scratch_gather_runs_without_a_future_warning(tmp_path):
    """One rank is enough to call the collective: gloo in this process, a file store."""
    assert not dist.is_initialized()
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0,
                            world_size=1)
    try:
        spec = fsdp.ParamSpec("w", nn.Identity(), "w", torch.Size((2, 3)))
        with warnings.catch_warnings():
            warnings.simplefilter("error", FutureWarning)
            full = fsdp.gather_full(torch.arange(6.0), spec, torch.float32)
        assert torch.equal(full, torch.arange(6.0).view(2, 3))
    finally:
        dist.destroy_process_group()
