"""The two instruments the checkers of notebooks 10-13 added to the framework: a course
function switched off however it is imported (builtins_off.refused_everywhere), and
CollectiveTrace's ``whole_nbytes``, which counts a list form's tensors together (an
all_to_all of whole copies must not look as cheap as one of its pieces). Also: torch 2.13's
single-tensor names and the deprecated ones that forward to them are one family each."""

from __future__ import annotations

import warnings

import pytest
import torch
import torch.distributed as dist

import ddp_lab
from ddp_lab.course.collective_trace import BuiltinSwitchedOff, CollectiveTrace
from ddp_lab.course.ch11_meshes import pipeline
from ddp_lab.course.ch11_meshes.pipeline import bubble as imported_bubble
from ddp_lab.exercises.builtins_off import families, refused_everywhere, switched_off

SPANS = [[("F0", 0.0, 1.0)], [("F0", 1.0, 2.0)]]


def test_a_switched_off_function_refuses_under_every_name_and_comes_back():
    with refused_everywhere(pipeline.bubble, "pipeline.bubble", "write it yourself"):
        for name in (pipeline.bubble, imported_bubble):
            with pytest.raises(BuiltinSwitchedOff, match="however it is imported: write it"):
                name(SPANS)
    assert imported_bubble(SPANS) == pytest.approx(0.5)


def test_a_closure_cannot_be_switched_off_this_way():
    def outer():
        held = 1

        def inner():
            return held
        return inner
    with pytest.raises(ValueError, match="closure"):
        with refused_everywhere(outer(), "inner", "why"):
            pass


def _list_forms():
    n, piece = dist.get_world_size(), torch.ones(6)
    with CollectiveTrace() as trace:
        dist.all_gather([torch.empty(6) for _ in range(n)], piece)
        dist.all_gather_single(torch.empty(6 * n), piece)
        dist.reduce_scatter(torch.empty(6), [torch.ones(6) for _ in range(n)])
        dist.all_to_all([torch.empty(6) for _ in range(n)], [torch.ones(6) for _ in range(n)])
        dist.broadcast(piece, 0)
        dist.barrier()
    return [(c.name, c.nbytes, c.whole_nbytes) for c in trace.calls]


@pytest.mark.timeout(120)
def test_whole_nbytes_counts_a_list_whole():
    calls = ddp_lab.run(_list_forms, world_size=3, backend="gloo", echo=False).values[0]
    assert calls == [("allgather_", 24, 72), ("_allgather_base_", 72, 72),
                     ("reduce_scatter_", 24, 72), ("alltoall_", 24, 72),
                     ("broadcast_", 24, 24), ("barrier", 0, 0)]


def test_single_tensor_names_new_and_deprecated_are_one_family():
    names = ("all_gather", "all_gather_single", "all_gather_into_tensor", "_all_gather_base",
             "reduce_scatter", "reduce_scatter_single", "reduce_scatter_tensor")
    assert families(names) == {"all_gather", "reduce_scatter"}


def _both_spellings_refused():
    n, piece = dist.get_world_size(), torch.ones(2)
    calls = {
        "all_gather_single": lambda: dist.all_gather_single(torch.empty(2 * n), piece),
        "all_gather_into_tensor": lambda: dist.all_gather_into_tensor(torch.empty(2 * n), piece),
        "reduce_scatter_single": lambda: dist.reduce_scatter_single(piece, torch.ones(2 * n)),
        "reduce_scatter_tensor": lambda: dist.reduce_scatter_tensor(piece, torch.ones(2 * n))}
    refused = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        with switched_off(("all_gather", "reduce_scatter"), "build it yourself"):
            for name, call in calls.items():
                try:
                    call()
                except BuiltinSwitchedOff as err:
                    refused[name] = str(err).split(" is switched off")[0]
    return refused


@pytest.mark.timeout(120)
def test_switched_off_refuses_the_new_and_the_deprecated_spelling():
    refused = ddp_lab.run(_both_spellings_refused, world_size=2, backend="gloo",
                          echo=False).values[0]
    assert refused == {"all_gather_single": "dist.all_gather",
                       "all_gather_into_tensor": "dist.all_gather",
                       "reduce_scatter_single": "dist.reduce_scatter",
                       "reduce_scatter_tensor": "dist.reduce_scatter"}
